//! Test fixture: `on_request` never returns. The host must stop it with its
//! CPU budget (epoch interruption / fuel) and answer with an error.

use std::hint::black_box;

use inlay_policy::{Action, Policy, Request};

/// Spins forever in `on_request`.
#[derive(Default)]
pub struct Loop;

impl Policy for Loop {
    fn on_request(&self, req: &Request) -> Action {
        // Misbehave only under /loop, so tests can show that other requests
        // on the same server keep working.
        if !req.path().starts_with("/loop") {
            return inlay_policy::builtin::recv(req);
        }
        let mut n: u64 = 0;
        // `black_box` keeps the optimiser from proving the loop useless.
        loop {
            n = black_box(n.wrapping_add(1));
        }
    }
}

inlay_policy::export!(Loop);

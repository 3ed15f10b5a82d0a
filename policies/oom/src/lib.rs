//! Test fixture: `on_request` allocates without end. The host's memory cap
//! must refuse the growth; the allocation failure aborts, which traps.

use std::hint::black_box;

use inlay_policy::{Action, Policy, Request};

/// Grows memory by 1 MiB chunks in `on_request` until it traps.
#[derive(Default)]
pub struct Oom;

/// One chunk; every byte is written so the pages are really used.
const CHUNK: usize = 1 << 20;

impl Policy for Oom {
    fn on_request(&self, req: &Request) -> Action {
        // Misbehave only under /oom, so tests can show that other requests
        // on the same server keep working.
        if !req.path().starts_with("/oom") {
            return inlay_policy::builtin::recv(req);
        }
        let mut chunks: Vec<Vec<u8>> = Vec::new();
        loop {
            chunks.push(black_box(vec![1u8; CHUNK]));
            black_box(&chunks);
        }
    }
}

inlay_policy::export!(Oom);

//! Test fixture: `on_request` panics, which traps the instance (the SDK
//! logs the panic message first). The host must answer with an error and
//! keep serving other requests.

use inlay_policy::{Action, Policy, Request};

/// Panics in `on_request`.
#[derive(Default)]
pub struct Trap;

impl Policy for Trap {
    fn on_request(&self, req: &Request) -> Action {
        // Misbehave only under /trap, so tests can show that other requests
        // on the same server keep working.
        if !req.path().starts_with("/trap") {
            return inlay_policy::builtin::recv(req);
        }
        panic!("trap fixture: refusing {} {}", req.method(), req.url());
    }
}

inlay_policy::export!(Trap);

#[cfg(test)]
mod tests {
    use inlay_policy::{Policy, Request};

    #[test]
    #[should_panic(expected = "trap fixture: refusing GET /trap/x")]
    fn on_request_panics() {
        super::Trap.on_request(&Request::new_local("GET", "/trap/x"));
    }
}

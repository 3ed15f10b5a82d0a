//! The generated host bindings for the `inlay:policy@0.1.0` world.
//!
//! Cache, kv and fetch imports are async (they await the host's storage
//! and network); the rest are plain calls. Every import is trappable so that
//! invalid handles and exhausted caps can stop the guest.

wasmtime::component::bindgen!({
    path: "../../guest-sdk/wit",
    world: "policy",
    imports: {
        "inlay:policy/cache": async | trappable,
        "inlay:policy/fetch": async | trappable,
        "inlay:policy/kv": async | trappable,
        default: trappable,
    },
    exports: { default: async },
    with: {
        "inlay:policy/types.request": inlay_core::RequestHead,
        "inlay:policy/types.response": inlay_core::ResponseHead,
    },
});

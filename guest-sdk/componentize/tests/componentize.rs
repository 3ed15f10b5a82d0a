//! End-to-end checks against the real WIT package: a dummy core module for
//! the `policy` world (no wasm toolchain needed) must encode to a component
//! that exports the handler, and broken inputs must be refused.

use std::path::PathBuf;

use inlay_componentize::{Error, HANDLER_INTERFACE, check_component, check_wit, componentize};
use wit_component::{StringEncoding, dummy_module, embed_component_metadata};
use wit_parser::{LiftLowerAbi, ManglingAndAbi, Resolve};

fn wit_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../wit")
}

/// A core module with the component-type section, as wit-bindgen leaves it.
fn policy_core_module() -> Vec<u8> {
    let mut resolve = Resolve::default();
    let (pkg, _) = resolve.push_dir(wit_dir()).expect("WIT parses");
    let world = resolve
        .select_world(&[pkg], Some("policy"))
        .expect("world `policy` exists");
    let mut module = dummy_module(&resolve, world, ManglingAndAbi::Legacy(LiftLowerAbi::Sync));
    embed_component_metadata(&mut module, &resolve, world, StringEncoding::UTF8)
        .expect("metadata embeds");
    module
}

#[test]
fn wit_package_parses_and_has_policy_world() {
    let worlds = check_wit(&wit_dir()).expect("WIT parses");
    assert_eq!(worlds, vec!["policy".to_string()]);
}

#[test]
fn dummy_policy_encodes_to_a_checked_component() {
    let component = componentize(&policy_core_module()).expect("encodes");
    let info = check_component(&component).expect("checks");
    assert!(info.exports.iter().any(|e| e == HANDLER_INTERFACE));
    // The dummy module imports every function of the world, clock included.
    for capability in ["log", "config", "cache", "kv", "fetch", "esi", "clock"] {
        let name = format!("inlay:policy/{capability}@0.1.0");
        assert!(info.imports.contains(&name), "{name} in {:?}", info.imports);
    }
}

#[test]
fn component_input_is_refused() {
    let component = componentize(&policy_core_module()).expect("encodes");
    assert!(matches!(
        componentize(&component),
        Err(Error::AlreadyComponent)
    ));
}

#[test]
fn core_module_without_metadata_is_refused() {
    // `(module)`: magic + version only, no component-type section. It
    // encodes to an empty component, which is refused for lacking a handler.
    let empty = b"\0asm\x01\0\0\0".to_vec();
    assert!(matches!(
        componentize(&empty),
        Err(Error::MissingHandler(..))
    ));
    assert!(matches!(check_component(&empty), Err(Error::NotComponent)));
}

#[test]
fn truncated_component_is_invalid() {
    let component = componentize(&policy_core_module()).expect("encodes");
    let cut = &component[..component.len() / 2];
    assert!(matches!(check_component(cut), Err(Error::Invalid(_))));
}

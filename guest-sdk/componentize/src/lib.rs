//! Turn a core WebAssembly module built with `wit-bindgen` into an Inlay
//! policy component, and check that a file is a valid policy component.
//!
//! `wit-bindgen` leaves the policy's world in a `component-type` custom
//! section of the core module; [`componentize`] reads it with
//! `wit-component` (the same 0.254 line the host's wasmtime accepts), writes
//! the component and validates it. [`check_component`] validates any file
//! and reports which capabilities it imports, so the build can refuse a
//! policy that does not export the `handler` interface. [`c_bindings`]
//! generates what `wit-bindgen c` does, so the C policies' build needs no
//! separately installed `wit-bindgen-cli`.
//!
//! A core module that imports WASI preview 1 (Go's `GOOS=wasip1` output)
//! is encoded with Inlay's preview 1 adapter ([`preview1_adapter`],
//! `guest-sdk/go/adapter`), which implements those imports on the policy
//! world's `log` and `clock`: the component imports no WASI.

use std::path::Path;

use wit_component::{ComponentEncoder, DecodedWasm};
use wit_parser::{Resolve, WorldItem};

/// The interface every policy component must export.
pub const HANDLER_INTERFACE: &str = "inlay:policy/handler@0.1.0";

/// Why a module could not be turned into a policy component.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The input is already a component, not a core module.
    #[error("the input is already a component, not a core module")]
    AlreadyComponent,
    /// The input is not a component (for example a core module).
    #[error("the input is not a component (is it the core module?)")]
    NotComponent,
    /// wit-component could not encode the module (bad or missing metadata).
    #[error("encoding the component failed: {0:#}")]
    Encode(anyhow::Error),
    /// The bytes do not validate as WebAssembly.
    #[error("the wasm does not validate: {0}")]
    Invalid(#[from] wasmparser::BinaryReaderError),
    /// The component's WIT could not be decoded.
    #[error("decoding the component's WIT failed: {0:#}")]
    Decode(anyhow::Error),
    /// The component does not export the interface it must (the policy
    /// handler, unless told otherwise).
    #[error("the component does not export `{0}` (exports: {1:?})")]
    MissingHandler(String, Vec<String>),
    /// A WIT package could not be parsed or resolved.
    #[error("the WIT package is invalid: {0:#}")]
    Wit(anyhow::Error),
    /// The C bindings generator refused the world.
    #[error("generating the C bindings failed: {0:#}")]
    CBindings(anyhow::Error),
    /// The preview 1 adapter could not be built (a bug in this crate).
    #[error("building the WASI preview 1 adapter failed: {0:#}")]
    Adapter(anyhow::Error),
}

/// What [`check_component`] found in a valid policy component.
#[derive(Debug)]
pub struct ComponentInfo {
    /// Imported interfaces, for example `inlay:policy/log@0.1.0`.
    pub imports: Vec<String>,
    /// Exported interfaces; always includes [`HANDLER_INTERFACE`].
    pub exports: Vec<String>,
}

/// The module name WASI preview 1 imports come from.
pub const PREVIEW1_MODULE: &str = "wasi_snapshot_preview1";

/// Encode a core module carrying `wit-bindgen`'s component-type section as a
/// component, then check it with [`check_component`]. A module importing
/// [`PREVIEW1_MODULE`] gets [`preview1_adapter`] for those imports.
pub fn componentize(core: &[u8]) -> Result<Vec<u8>, Error> {
    componentize_exporting(core, HANDLER_INTERFACE)
}

/// [`componentize`] for a component that must export `export` (an
/// interface, with or without its version: `wasi:http/incoming-handler`
/// for a `wasi:http` component).
pub fn componentize_exporting(core: &[u8], export: &str) -> Result<Vec<u8>, Error> {
    if wasmparser::Parser::is_component(core) {
        return Err(Error::AlreadyComponent);
    }
    let mut encoder = ComponentEncoder::default()
        .module(core)
        .map_err(Error::Encode)?;
    if imports_preview1(core)? {
        encoder = encoder
            .adapter(PREVIEW1_MODULE, &preview1_adapter()?)
            .map_err(Error::Encode)?;
    }
    let component = encoder.validate(true).encode().map_err(Error::Encode)?;
    check_component_exporting(&component, export)?;
    Ok(component)
}

/// `core` with `world` of the WIT package directory `dir` embedded as a
/// `component-type` section, for [`componentize`]: for modules whose
/// toolchain cannot write custom sections itself (Go's bindings from
/// `wit-bindgen go` leave the world to the componentize step).
pub fn embed_world(core: &[u8], dir: &Path, world: &str) -> Result<Vec<u8>, Error> {
    let mut resolve = Resolve::default();
    let (pkg, _files) = resolve.push_dir(dir).map_err(Error::Wit)?;
    let mut module = core.to_vec();
    embed(&mut module, &resolve, pkg, world).map_err(Error::Wit)?;
    Ok(module)
}

/// Embeds `world` of the package `pkg` in `module` as wit-bindgen does.
fn embed(
    module: &mut Vec<u8>,
    resolve: &Resolve,
    pkg: wit_parser::PackageId,
    world: &str,
) -> anyhow::Result<()> {
    let world = resolve.select_world(&[pkg], Some(world))?;
    wit_component::embed_component_metadata(
        module,
        resolve,
        world,
        wit_component::StringEncoding::UTF8,
    )
}

/// Whether the core module imports anything from [`PREVIEW1_MODULE`].
fn imports_preview1(core: &[u8]) -> Result<bool, Error> {
    for payload in wasmparser::Parser::new(0).parse_all(core) {
        if let wasmparser::Payload::ImportSection(imports) = payload? {
            for import in imports.into_imports() {
                if import?.module == PREVIEW1_MODULE {
                    return Ok(true);
                }
            }
        }
    }
    Ok(false)
}

/// The policy world, which the adapter's world borrows its interfaces from.
const POLICY_WIT: &str = include_str!("../../wit/policy.wit");

/// The adapter's source: the whole of WASI preview 1 on `log` and `clock`.
const PREVIEW1_ADAPTER_WAT: &str = include_str!("../../go/adapter/wasi_snapshot_preview1.wat");

/// Inlay's WASI preview 1 adapter, in place of wasmtime's
/// (`wasi-preview1-component-adapter`, which needs WASI 0.2 from the host):
/// a core module exporting every preview 1 function, written on the
/// `inlay:policy` world's `log` (stdout and stderr lines) and `clock` (the
/// wall clock; the monotonic clock is virtual), with its world embedded
/// for wit-component. See `guest-sdk/go/adapter/wasi_snapshot_preview1.wat`.
pub fn preview1_adapter() -> Result<Vec<u8>, Error> {
    let mut module = wat::parse_str(PREVIEW1_ADAPTER_WAT).map_err(|e| Error::Adapter(e.into()))?;
    // The adapter's world, beside `policy` in the same package: what it imports.
    let wit = format!(
        "{POLICY_WIT}\nworld preview1-adapter {{\n    import log;\n    import clock;\n}}\n"
    );
    let mut resolve = Resolve::default();
    let pkg = resolve
        .push_str("policy.wit", &wit)
        .map_err(Error::Adapter)?;
    embed(&mut module, &resolve, pkg, "preview1-adapter").map_err(Error::Adapter)?;
    Ok(module)
}

/// Validate `bytes` as a component (every wasm feature wasmtime may enable)
/// and check that it exports [`HANDLER_INTERFACE`].
pub fn check_component(bytes: &[u8]) -> Result<ComponentInfo, Error> {
    check_component_exporting(bytes, HANDLER_INTERFACE)
}

/// [`check_component`] for a component that must export `export` (with
/// its version, or without: any version).
pub fn check_component_exporting(bytes: &[u8], export: &str) -> Result<ComponentInfo, Error> {
    if !wasmparser::Parser::is_component(bytes) {
        return Err(Error::NotComponent);
    }
    wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all())
        .validate_all(bytes)?;
    let decoded = wit_component::decode(bytes).map_err(Error::Decode)?;
    let (resolve, world) = match &decoded {
        DecodedWasm::Component(resolve, world) => (resolve, *world),
        // `is_component` said otherwise; treat a WIT package as "not a policy".
        DecodedWasm::WitPackage(..) => return Err(Error::NotComponent),
    };
    let world = &resolve.worlds[world];
    let names = |items: &wit_parser::IndexMap<wit_parser::WorldKey, WorldItem>| {
        items
            .iter()
            .filter(|(_, item)| matches!(item, WorldItem::Interface { .. }))
            .map(|(key, _)| resolve.name_world_key(key))
            .collect::<Vec<_>>()
    };
    let info = ComponentInfo {
        imports: names(&world.imports),
        exports: names(&world.exports),
    };
    let exported =
        |e: &String| e == export || e.strip_prefix(export).is_some_and(|v| v.starts_with('@'));
    if !info.exports.iter().any(exported) {
        return Err(Error::MissingHandler(export.to_owned(), info.exports));
    }
    Ok(info)
}

/// Parse and resolve a WIT package directory (for example
/// `guest-sdk/wit`), returning the names of its worlds.
pub fn check_wit(dir: &Path) -> Result<Vec<String>, Error> {
    let mut resolve = Resolve::default();
    let (pkg, _files) = resolve.push_dir(dir).map_err(Error::Wit)?;
    Ok(resolve.packages[pkg]
        .worlds
        .keys()
        .map(ToString::to_string)
        .collect())
}

/// One file of generated bindings: its name (no folder) and contents.
#[derive(Debug)]
pub struct GeneratedFile {
    /// For example `policy.h`.
    pub name: String,
    /// The bytes to write.
    pub contents: Vec<u8>,
}

/// Generate the C bindings of `world` in the WIT package directory `dir`,
/// the files `wit-bindgen c DIR -w WORLD` (wit-bindgen-cli of the same
/// version, default options) writes: `<world>.h`, `<world>.c` and
/// `<world>_component_type.o`, the object that carries the world to
/// wit-component through the linker. They are the CLI's byte for byte, but
/// for the wit-component version the object's producers section names.
pub fn c_bindings(dir: &Path, world: &str) -> Result<Vec<GeneratedFile>, Error> {
    let mut resolve = Resolve::default();
    let (pkg, _files) = resolve.push_dir(dir).map_err(Error::Wit)?;
    let world = resolve
        .select_world(&[pkg], Some(world))
        .map_err(Error::Wit)?;
    let mut files = wit_bindgen_core::Files::default();
    wit_bindgen_c::Opts::default()
        .build()
        .generate(&mut resolve, world, &mut files)
        .map_err(Error::CBindings)?;
    Ok(files
        .iter()
        .map(|(name, contents)| GeneratedFile {
            name: name.to_owned(),
            contents: contents.to_owned(),
        })
        .collect())
}

//! Fewer data segments in a policy's core modules, so that each request's
//! instance starts faster.
//!
//! wasmtime keeps a length and a base pointer for every data segment of a
//! module in each instance's `VMContext`, and writes them all at every
//! instantiation, whether the memory comes from a copy-on-write image (it
//! does here) or not. Snapshot tools emit many segments: wizer writes one
//! per non-zero run of memory (up to 10 000) and turns every segment it
//! applied into an empty passive one, so the same indices stay valid. A
//! ComponentizeJS policy, snapshotted by ComponentizeJS and again by
//! [`prewarm`](super::prewarm), has 20 000 segments: 240 KB of `VMContext`
//! written per request. Measured on an empty JavaScript policy: 22 us per
//! instantiation, 6.7 us after this pass.
//!
//! A core module is rewritten only when that cannot change what it does:
//! - no function uses `memory.init` or `data.drop`, so no code refers to a
//!   segment by its index, and passive segments are never read;
//! - every active segment has a constant offset, and no two overlap, so
//!   the order they are applied in does not matter.
//!
//! Then passive segments are dropped, and active segments of the same
//! memory less than [`MAX_GAP`] apart are joined, the gap filled with the
//! zeros that memory holds there. The memory at instantiation is the same
//! byte for byte. Any other module, and any binary this pass cannot read,
//! is left as it is: this is an optimisation, never a reason to refuse a
//! policy.

use std::borrow::Cow;

use wasm_encoder::{ConstExpr, DataCountSection, DataSection};
use wasmparser::{BinaryReader, DataKind, Operator};

/// Active segments closer than this are joined into one. One page: a gap
/// inside a page adds no page to the copy-on-write image.
pub(crate) const MAX_GAP: u64 = 4096;

/// Section ids of the binary format used here.
const CORE_MODULE: u8 = 1; // in a component
const NESTED_COMPONENT: u8 = 4; // in a component
const CODE: u8 = 10;
const DATA: u8 = 11;
const DATA_COUNT: u8 = 12;

/// `binary` (a component or a core module) with its core modules'
/// data segments compacted; borrowed when nothing changed or the binary
/// could not be read.
pub(crate) fn compact_data_segments(binary: &[u8]) -> Cow<'_, [u8]> {
    match rewrite(binary) {
        Ok(Some(out)) => Cow::Owned(out),
        Ok(None) => Cow::Borrowed(binary),
        Err(e) => {
            tracing::debug!(error = %e, "data segments left as they are");
            Cow::Borrowed(binary)
        }
    }
}

/// One section: its id and contents.
struct Section<'a> {
    id: u8,
    contents: &'a [u8],
}

/// Splits a component or module binary into its 8-byte header and its
/// sections.
fn sections(binary: &[u8]) -> Result<(&[u8], Vec<Section<'_>>), String> {
    if binary.len() < 8 || &binary[..4] != b"\0asm" {
        return Err("not a WebAssembly binary".into());
    }
    let mut reader = BinaryReader::new(&binary[8..], 8);
    let mut out = Vec::new();
    while !reader.eof() {
        let id = reader.read_u8().map_err(|e| e.to_string())?;
        let len = reader.read_var_u32().map_err(|e| e.to_string())?;
        let contents = reader.read_bytes(len as usize).map_err(|e| e.to_string())?;
        out.push(Section { id, contents });
    }
    Ok((&binary[..8], out))
}

fn is_component(header: &[u8]) -> bool {
    // Bytes 6-7 are the layer: 0 for a core module, 1 for a component.
    header[6] == 1
}

/// The rewritten binary, or `None` when no module in it changed.
fn rewrite(binary: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let (header, sections) = sections(binary)?;
    if !is_component(header) {
        return compact_module(header, &sections);
    }
    let mut changed = false;
    let mut out = header.to_vec();
    for section in &sections {
        let nested = match section.id {
            CORE_MODULE => {
                let (header, inner) = self::sections(section.contents)?;
                compact_module(header, &inner)?
            }
            NESTED_COMPONENT => rewrite(section.contents)?,
            _ => None,
        };
        let contents = match &nested {
            Some(bytes) => {
                changed = true;
                bytes.as_slice()
            }
            None => section.contents,
        };
        push_section(&mut out, section.id, contents);
    }
    Ok(changed.then_some(out))
}

fn push_section(out: &mut Vec<u8>, id: u8, contents: &[u8]) {
    use wasm_encoder::Encode;
    out.push(id);
    // A byte slice encodes as its LEB128 length, then the bytes.
    contents.encode(out);
}

/// An active segment with a constant offset.
struct Segment<'a> {
    memory: u32,
    offset: u64,
    data: Cow<'a, [u8]>,
}

impl Segment<'_> {
    fn end(&self) -> u64 {
        self.offset + self.data.len() as u64
    }
}

/// The module with its data segments compacted, or `None` when it must
/// stay as it is (see the module docs) or would not get smaller.
fn compact_module(header: &[u8], sections: &[Section<'_>]) -> Result<Option<Vec<u8>>, String> {
    let Some(data) = sections.iter().find(|s| s.id == DATA) else {
        return Ok(None);
    };
    let reader = wasmparser::DataSectionReader::new(BinaryReader::new(data.contents, 0))
        .map_err(|e| e.to_string())?;
    let total = reader.count();
    if total < 2 {
        return Ok(None);
    }
    let mut active = Vec::new();
    for segment in reader {
        let segment = segment.map_err(|e| e.to_string())?;
        match segment.kind {
            DataKind::Passive => {}
            DataKind::Active {
                memory_index,
                offset_expr,
            } => {
                let Some(offset) = constant_offset(&offset_expr)? else {
                    return Ok(None);
                };
                active.push(Segment {
                    memory: memory_index,
                    offset,
                    data: Cow::Borrowed(segment.data),
                });
            }
        }
    }
    if let Some(code) = sections.iter().find(|s| s.id == CODE)
        && uses_segment_indices(code.contents)?
    {
        return Ok(None);
    }
    active.sort_by_key(|s| (s.memory, s.offset));
    if active
        .windows(2)
        .any(|w| w[0].memory == w[1].memory && w[1].offset < w[0].end())
    {
        return Ok(None);
    }
    let merged = merge(active);
    if merged.len() >= total as usize {
        return Ok(None);
    }
    let memories64 = memories64(sections)?;
    let mut section = DataSection::new();
    for segment in &merged {
        let Some(&memory64) = memories64.get(segment.memory as usize) else {
            return Err(format!(
                "data segment for memory {}, which does not exist",
                segment.memory
            ));
        };
        let offset = if memory64 {
            ConstExpr::i64_const(segment.offset as i64)
        } else {
            ConstExpr::i32_const(segment.offset as u32 as i32)
        };
        section.active(segment.memory, &offset, segment.data.iter().copied());
    }
    let mut out = header.to_vec();
    for s in sections {
        match s.id {
            DATA => push_encoded(&mut out, &section),
            DATA_COUNT => push_encoded(
                &mut out,
                &DataCountSection {
                    count: merged.len() as u32,
                },
            ),
            id => push_section(&mut out, id, s.contents),
        }
    }
    Ok(Some(out))
}

/// Appends a section built with wasm-encoder (its `encode` writes the
/// size and the contents, not the id).
fn push_encoded(out: &mut Vec<u8>, section: &impl wasm_encoder::Section) {
    out.push(section.id());
    section.encode(out);
}

/// Joins neighbouring segments of one memory less than [`MAX_GAP`] apart.
/// `segments` are sorted and do not overlap.
fn merge(segments: Vec<Segment<'_>>) -> Vec<Segment<'_>> {
    let mut out: Vec<Segment<'_>> = Vec::with_capacity(segments.len());
    for segment in segments {
        if let Some(last) = out.last_mut()
            && last.memory == segment.memory
            && segment.offset - last.end() < MAX_GAP
        {
            let gap = (segment.offset - last.end()) as usize;
            let data = last.data.to_mut();
            data.resize(data.len() + gap, 0);
            data.extend_from_slice(&segment.data);
            continue;
        }
        out.push(segment);
    }
    out
}

/// The offset of an active segment when it is a constant.
fn constant_offset(expr: &wasmparser::ConstExpr<'_>) -> Result<Option<u64>, String> {
    let mut ops = expr.get_operators_reader();
    let value = match ops.read().map_err(|e| e.to_string())? {
        Operator::I32Const { value } => u64::from(value as u32),
        Operator::I64Const { value } => value as u64,
        _ => return Ok(None),
    };
    match ops.read().map_err(|e| e.to_string())? {
        Operator::End => Ok(Some(value)),
        _ => Ok(None),
    }
}

/// Whether each memory (imports first, as in the index space) is 64-bit.
fn memories64(sections: &[Section<'_>]) -> Result<Vec<bool>, String> {
    let mut memories = Vec::new();
    for s in sections {
        match s.id {
            2 => {
                let reader = wasmparser::ImportSectionReader::new(BinaryReader::new(s.contents, 0))
                    .map_err(|e| e.to_string())?;
                for import in reader.into_imports() {
                    if let wasmparser::TypeRef::Memory(ty) = import.map_err(|e| e.to_string())?.ty {
                        memories.push(ty.memory64);
                    }
                }
            }
            5 => {
                let reader = wasmparser::MemorySectionReader::new(BinaryReader::new(s.contents, 0))
                    .map_err(|e| e.to_string())?;
                for ty in reader {
                    memories.push(ty.map_err(|e| e.to_string())?.memory64);
                }
            }
            _ => {}
        }
    }
    Ok(memories)
}

/// Whether any function uses `memory.init` or `data.drop`. Their opcodes
/// are 0xFC 0x08 and 0xFC 0x09; a code section without those byte pairs
/// cannot contain them, which spares decoding 10 MB of code in most
/// cases.
fn uses_segment_indices(code: &[u8]) -> Result<bool, String> {
    if !memchr::memchr_iter(0xFC, code).any(|i| matches!(code.get(i + 1), Some(0x08 | 0x09))) {
        return Ok(false);
    }
    let reader = wasmparser::CodeSectionReader::new(BinaryReader::new(code, 0))
        .map_err(|e| e.to_string())?;
    for body in reader {
        let body = body.map_err(|e| e.to_string())?;
        let mut ops = body.get_operators_reader().map_err(|e| e.to_string())?;
        while !ops.eof() {
            match ops.read().map_err(|e| e.to_string())? {
                Operator::MemoryInit { .. } | Operator::DataDrop { .. } => return Ok(true),
                _ => {}
            }
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_segments(module: &[u8]) -> usize {
        let (_, sections) = sections(module).expect("sections");
        sections
            .iter()
            .find(|s| s.id == DATA)
            .map(|s| {
                wasmparser::DataSectionReader::new(BinaryReader::new(s.contents, 0))
                    .expect("data")
                    .count() as usize
            })
            .unwrap_or(0)
    }

    /// The first `len` bytes of memory `mem` after instantiating `module`.
    fn memory_after_start(module: &[u8], len: usize) -> Vec<u8> {
        let engine = wasmtime::Engine::default();
        let module = wasmtime::Module::new(&engine, module).expect("valid module");
        let mut store = wasmtime::Store::new(&engine, ());
        let instance = wasmtime::Instance::new(&mut store, &module, &[]).expect("instantiates");
        let memory = instance.get_memory(&mut store, "mem").expect("exports mem");
        memory.data(&store)[..len].to_vec()
    }

    #[test]
    fn close_segments_are_joined_and_memory_is_the_same() {
        let module = wat::parse_str(
            r#"(module
                (memory (export "mem") 2)
                (data (i32.const 4096) "later")
                (data (i32.const 16) "abc")
                (data "passive, never read")
                (data (i32.const 100) "def")
                (data (i32.const 70000) "far away")
                (func (export "f") (result i32) (i32.load (i32.const 16))))"#,
        )
        .expect("wat");
        let compacted = compact_data_segments(&module);
        assert!(
            matches!(compacted, Cow::Owned(_)),
            "the module is rewritten"
        );
        // 16, 100 and 4096 are joined (gaps under a page); 70000 stays apart;
        // the passive segment goes.
        assert_eq!(data_segments(&module), 5);
        assert_eq!(data_segments(&compacted), 2);
        assert_eq!(
            memory_after_start(&compacted, 2 << 16),
            memory_after_start(&module, 2 << 16)
        );
    }

    #[test]
    fn modules_that_name_segments_in_code_are_left_alone() {
        for wat in [
            // memory.init reads a passive segment by its index.
            r#"(module (memory 1) (data (i32.const 0) "a") (data "b") (data (i32.const 8) "c")
                (func (memory.init 1 (i32.const 0) (i32.const 0) (i32.const 1))))"#,
            // data.drop names an index too.
            r#"(module (memory 1) (data (i32.const 0) "a") (data (i32.const 8) "c")
                (func (data.drop 0)))"#,
            // Overlapping segments: the later one wins, so order matters.
            r#"(module (memory 1) (data (i32.const 0) "aaaa") (data (i32.const 2) "bb"))"#,
            // An offset known only at instantiation.
            r#"(module (import "env" "base" (global i32)) (memory 1)
                (data (global.get 0) "a") (data (i32.const 8) "c"))"#,
        ] {
            let module = wat::parse_str(wat).expect("wat");
            assert!(
                matches!(compact_data_segments(&module), Cow::Borrowed(_)),
                "rewrote {wat}"
            );
        }
    }

    #[test]
    fn a_component_keeps_working_with_its_modules_compacted() {
        // The runtime's probe guest, encoded as a component by the host.
        let core = include_bytes!("testdata/probe.core.wasm");
        assert!(data_segments(core) > 1, "the probe has segments to join");
        let component = wit_component::ComponentEncoder::default()
            .module(core)
            .expect("module")
            .encode()
            .expect("component");
        let compacted = compact_data_segments(&component);
        assert!(matches!(compacted, Cow::Owned(_)), "the probe is compacted");
        wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all())
            .validate_all(&compacted)
            .expect("the compacted component validates");
        let engine = wasmtime::Engine::new(wasmtime::Config::new().wasm_component_model(true))
            .expect("engine");
        wasmtime::component::Component::new(&engine, &*compacted).expect("compiles");
    }

    #[test]
    fn what_is_not_wasm_is_returned_as_it_is() {
        assert!(matches!(
            compact_data_segments(b"not wasm"),
            Cow::Borrowed(_)
        ));
        let truncated =
            &wat::parse_str("(module (memory 1) (data (i32.const 0) \"a\"))").expect("wat")[..12];
        assert!(matches!(compact_data_segments(truncated), Cow::Borrowed(_)));
    }
}

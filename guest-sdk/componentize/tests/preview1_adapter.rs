//! Inlay's WASI preview 1 adapter (`guest-sdk/go/adapter`): a module that
//! imports preview 1 becomes a component importing no WASI, and the
//! adapter's functions do what Go's runtime needs of them, run here in
//! wasmtime against a recording `log` and a fixed `clock`.

use std::path::PathBuf;

use inlay_componentize::{check_component, componentize, embed_world, preview1_adapter};
use wasmtime::{Caller, Engine, Instance, Linker, Memory, MemoryType, Module, Store};

fn wit_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../wit")
}

/// A policy core module as Go leaves it: the handler's exports (their
/// canonical ABI signatures), preview 1 imports, no component-type section.
const GO_LIKE_POLICY: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "clock_time_get" (func (param i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "random_get" (func (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "poll_oneoff" (func (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "adapter_monotonic_clock_set_paused" (func (param i32)))
  (memory (export "memory") 1)
  (func (export "_initialize"))
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) i32.const 1024)
  (func (export "inlay:policy/handler@0.1.0#on-request") (param i32) (result i32) i32.const 0)
  (func (export "cabi_post_inlay:policy/handler@0.1.0#on-request") (param i32))
  (func (export "inlay:policy/handler@0.1.0#on-backend-response")
    (param i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32) i32.const 0)
  (func (export "cabi_post_inlay:policy/handler@0.1.0#on-backend-response") (param i32))
  (func (export "inlay:policy/handler@0.1.0#on-deliver") (param i32 i32))
)"#;

#[test]
fn preview1_imports_become_log_and_clock() {
    let core = wat::parse_str(GO_LIKE_POLICY).expect("the fixture parses");
    let core = embed_world(&core, &wit_dir(), "policy").expect("the world embeds");
    let component = componentize(&core).expect("encodes with the adapter");
    let info = check_component(&component).expect("checks");
    let mut imports = info.imports.clone();
    imports.sort();
    // `types` for the handler's resources; `log` and `clock` for the
    // adapter; no WASI.
    assert_eq!(
        imports,
        [
            "inlay:policy/clock@0.1.0",
            "inlay:policy/log@0.1.0",
            "inlay:policy/types@0.1.0"
        ],
    );
}

/// What the adapter's imports saw.
#[derive(Default)]
struct Recorded {
    lines: Vec<(i32, String)>,
    now_ms: u64,
}

struct Adapter {
    store: Store<Recorded>,
    instance: Instance,
    memory: Memory,
}

impl Adapter {
    fn new() -> Self {
        let engine = Engine::default();
        let module = Module::new(&engine, preview1_adapter().expect("the adapter builds"))
            .expect("the adapter compiles");
        let mut store = Store::new(
            &engine,
            Recorded {
                now_ms: 1_700_000_000_123,
                ..Recorded::default()
            },
        );
        let memory = Memory::new(&mut store, MemoryType::new(1, None)).unwrap();
        let mut linker = Linker::new(&engine);
        linker.define(&store, "env", "memory", memory).unwrap();
        linker
            .func_wrap(
                "inlay:policy/log@0.1.0",
                "write",
                move |mut caller: Caller<'_, Recorded>, level: i32, ptr: i32, len: i32| {
                    let mut bytes = vec![0; len as usize];
                    memory.read(&caller, ptr as usize, &mut bytes).unwrap();
                    // The host lifts a string: it must be UTF-8.
                    let line = String::from_utf8(bytes).expect("the adapter sends UTF-8 only");
                    caller.data_mut().lines.push((level, line));
                },
            )
            .unwrap();
        linker
            .func_wrap(
                "inlay:policy/clock@0.1.0",
                "now-unix-ms",
                |caller: Caller<'_, Recorded>| caller.data().now_ms as i64,
            )
            .unwrap();
        let instance = linker
            .instantiate(&mut store, &module)
            .expect("instantiates");
        Self {
            store,
            instance,
            memory,
        }
    }

    fn call<P: wasmtime::WasmParams, R: wasmtime::WasmResults>(
        &mut self,
        name: &str,
        params: P,
    ) -> wasmtime::Result<R> {
        let f = self
            .instance
            .get_typed_func::<P, R>(&mut self.store, name)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        f.call(&mut self.store, params)
    }

    fn write(&mut self, at: usize, bytes: &[u8]) {
        self.memory.write(&mut self.store, at, bytes).unwrap();
    }

    fn u32_at(&self, at: usize) -> u32 {
        let mut b = [0; 4];
        self.memory.read(&self.store, at, &mut b).unwrap();
        u32::from_le_bytes(b)
    }

    fn u64_at(&self, at: usize) -> u64 {
        let mut b = [0; 8];
        self.memory.read(&self.store, at, &mut b).unwrap();
        u64::from_le_bytes(b)
    }

    /// fd_write of `pieces` (one iovec each) to `fd`: errno, bytes written.
    fn fd_write(&mut self, fd: i32, pieces: &[&[u8]]) -> (i32, u32) {
        let mut data = 4096;
        for (i, piece) in pieces.iter().enumerate() {
            self.write(data, piece);
            let iov = 1024 + i * 8;
            self.write(iov, &(data as u32).to_le_bytes());
            self.write(iov + 4, &(piece.len() as u32).to_le_bytes());
            data += piece.len() + 16;
        }
        let errno: i32 = self
            .call("fd_write", (fd, 1024, pieces.len() as i32, 512))
            .unwrap();
        (errno, self.u32_at(512))
    }

    fn clock(&mut self, id: i32) -> (i32, u64) {
        let errno: i32 = self.call("clock_time_get", (id, 0i64, 256)).unwrap();
        (errno, self.u64_at(256))
    }
}

#[test]
fn stdout_and_stderr_lines_become_log_lines() {
    let mut a = Adapter::new();
    assert_eq!(a.fd_write(1, &[b"hello\nwor", b"ld\n"]), (0, 12));
    assert_eq!(
        a.fd_write(2, &[b"panic: boom\n\ngoroutine 1 [running]:\n"]),
        (0, 36)
    );
    // Bytes that are not UTF-8 end the line there; a cut character too.
    assert_eq!(
        a.fd_write(
            1,
            &[b"ok \xff rest\n", "caf\u{e9}".as_bytes()[..4].as_ref()]
        )
        .0,
        0
    );
    assert_eq!(a.fd_write(1, &["\u{1f600} \u{e9}\u{800}".as_bytes()]).0, 0);
    // Overlong and surrogate encodings are not UTF-8 either.
    assert_eq!(a.fd_write(2, &[b"a\xc0\xafb", b"c\xed\xa0\x80d"]).0, 0);
    let info = 2;
    let error = 4;
    assert_eq!(
        a.store.data().lines,
        [
            (info, "hello".to_string()),
            (info, "wor".to_string()),
            (info, "ld".to_string()),
            (error, "panic: boom".to_string()),
            (error, "goroutine 1 [running]:".to_string()),
            (info, "ok ".to_string()),
            (info, "caf".to_string()),
            (info, "\u{1f600} \u{e9}\u{800}".to_string()),
            (error, "a".to_string()),
            (error, "c".to_string()),
        ]
    );
    // Other descriptors do not exist.
    assert_eq!(a.fd_write(0, &[b"x"]).0, 8, "EBADF");
    assert_eq!(a.fd_write(3, &[b"x"]).0, 8, "EBADF");
}

#[test]
fn the_wall_clock_is_the_hosts_and_the_monotonic_one_virtual() {
    let mut a = Adapter::new();
    let (errno, first) = a.clock(1);
    assert_eq!(errno, 0);
    let (_, second) = a.clock(1);
    assert!(second > first, "monotonic: {first} then {second}");
    assert_eq!(
        a.clock(0),
        (0, 1_700_000_000_123_000_000),
        "realtime, in ns"
    );
    // Reading the wall clock brings the monotonic one to it, so that
    // time.Since measures wall time between two reads of time.Now.
    let (_, after_wall) = a.clock(1);
    assert!(after_wall > 1_700_000_000_123_000_000);
    a.store.data_mut().now_ms += 250;
    a.clock(0);
    let (_, later) = a.clock(1);
    assert!(
        later - after_wall >= 250_000_000,
        "{after_wall} then {later}"
    );
    // CPU-time clocks are refused.
    assert_eq!(a.clock(2).0, 28, "EINVAL");
    assert_eq!(a.clock(3).0, 28, "EINVAL");
    // Only the wall clock's read calls the host: the pause is a no-op.
    let () = a.call("adapter_monotonic_clock_set_paused", 1).unwrap();
}

#[test]
fn timers_fire_at_once_in_virtual_time() {
    let mut a = Adapter::new();
    let (_, before) = a.clock(1);
    // Two clock subscriptions (relative 5 s and 2 s) and their userdata.
    for (i, (userdata, timeout)) in [(11u64, 5_000_000_000u64), (22, 2_000_000_000)]
        .into_iter()
        .enumerate()
    {
        let sub = 2048 + i * 48;
        a.write(sub, &[0; 48]);
        a.write(sub, &userdata.to_le_bytes());
        a.write(sub + 24, &timeout.to_le_bytes());
    }
    let errno: i32 = a.call("poll_oneoff", (2048, 3072, 2, 600)).unwrap();
    assert_eq!(errno, 0);
    assert_eq!(a.u32_at(600), 1, "one event");
    assert_eq!(a.u64_at(3072), 22, "the earlier timer");
    let (_, after) = a.clock(1);
    assert!(after >= before + 2_000_000_000 && after < before + 3_000_000_000);
    // A file descriptor subscription fails with EBADF at once.
    a.write(2048 + 8, &[1]);
    let errno: i32 = a.call("poll_oneoff", (2048, 3072, 1, 600)).unwrap();
    assert_eq!((errno, a.u32_at(600)), (0, 1));
    let mut event = [0; 11];
    a.memory.read(&a.store, 3072, &mut event).unwrap();
    assert_eq!(u16::from_le_bytes([event[8], event[9]]), 8, "EBADF");
    assert_eq!(event[10], 1, "fd_read");
    assert_eq!(
        a.call::<_, i32>("poll_oneoff", (2048, 3072, 0, 600))
            .unwrap(),
        28
    );
}

#[test]
fn no_randomness_files_arguments_or_exit() {
    let mut a = Adapter::new();
    assert_eq!(
        a.call::<_, i32>("random_get", (256, 16)).unwrap(),
        52,
        "ENOSYS"
    );
    assert_eq!(
        a.call::<_, i32>("fd_prestat_get", (3, 256)).unwrap(),
        8,
        "EBADF"
    );
    assert_eq!(
        a.call::<_, i32>("path_open", (3, 0, 256, 1, 0, 0i64, 0i64, 0, 300))
            .unwrap(),
        52
    );
    a.write(256, &[0xff; 8]);
    assert_eq!(a.call::<_, i32>("args_sizes_get", (256, 260)).unwrap(), 0);
    assert_eq!((a.u32_at(256), a.u32_at(260)), (0, 0));
    assert_eq!(
        a.call::<_, i32>("environ_sizes_get", (256, 260)).unwrap(),
        0
    );
    assert_eq!((a.u32_at(256), a.u32_at(260)), (0, 0));
    // stdin is at its end; stdio is a character device.
    a.write(300, &[0xff; 4]);
    assert_eq!(a.call::<_, i32>("fd_read", (0, 1024, 0, 300)).unwrap(), 0);
    assert_eq!(a.u32_at(300), 0);
    assert_eq!(a.call::<_, i32>("fd_fdstat_get", (1, 256)).unwrap(), 0);
    let mut filetype = [0];
    a.memory.read(&a.store, 256, &mut filetype).unwrap();
    assert_eq!(filetype[0], 2, "character device");
    assert_eq!(a.call::<_, i32>("fd_fdstat_get", (5, 256)).unwrap(), 8);
    let exit = a.call::<_, ()>("proc_exit", 2).unwrap_err();
    assert!(
        format!("{exit:?}").contains("unreachable"),
        "proc_exit traps: {exit:?}"
    );
}

//! The `inlay` binary. All logic lives in the library; see `inlay --help`.

/// The process's allocator: mimalloc, not glibc's malloc. A request's
/// allocations are often freed on another thread than the one that made
/// them (a component's response, made by its instance's task, sent by the
/// connection's); glibc then locks the other thread's arena, and under
/// load half of the process's futex calls were those locks (docs/performance.md,
/// "Components"). Built without transparent huge pages (`no_thp`), which
/// held 18-20 MiB more while a large body streamed.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc 3's `mi_option_e` (`mimalloc.h`):
/// how long freed memory waits before it goes back to the system.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

fn main() -> std::process::ExitCode {
    // Memory freed (a dropped ban list, a body's buffers) goes back to the
    // system within 10 ms rather than mimalloc 3's default second, so
    // that the process's size follows what it holds.
    // SAFETY: sets one integer option before any other thread starts.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 10);
    }
    inlay::cli::main()
}

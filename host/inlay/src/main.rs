//! The `inlay` binary. All logic lives in the library; see `inlay --help`.

fn main() -> std::process::ExitCode {
    inlay::cli::main()
}

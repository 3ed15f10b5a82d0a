//! `inlay-componentize`: build and check Inlay policy components.
//!
//! ```text
//! inlay-componentize encode policy.core.wasm -o policy.wasm
//! inlay-componentize encode --wit guest-sdk/wit policy.core.wasm -o policy.wasm
//! inlay-componentize check target/policies/*.wasm
//! inlay-componentize wit guest-sdk/wit
//! inlay-componentize c-bindings guest-sdk/wit --world policy -o target/lang/c/gen
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

/// Build and check Inlay policy components.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Turn a core module (built with wit-bindgen) into a component; one
    /// that imports WASI preview 1 gets Inlay's adapter for it.
    Encode {
        /// The core module.
        input: PathBuf,
        /// Where to write the component (written atomically).
        #[arg(short, long)]
        output: PathBuf,
        /// The interface the component must export (a policy's handler
        /// unless given; `wasi:http/incoming-handler` for a component
        /// backend).
        #[arg(long, default_value = inlay_componentize::HANDLER_INTERFACE)]
        export: String,
        /// Take the world from this WIT package directory instead of the
        /// module's `component-type` section (Go's bindings have none).
        #[arg(long)]
        wit: Option<PathBuf>,
        /// The world of `--wit`.
        #[arg(long, default_value = "policy", requires = "wit")]
        world: String,
    },
    /// Check that files are valid policy components; print their imports.
    Check {
        /// Component files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// The interface each must export (a policy's handler unless given).
        #[arg(long, default_value = inlay_componentize::HANDLER_INTERFACE)]
        export: String,
    },
    /// Check that a WIT package directory parses; print its worlds.
    Wit {
        /// The directory holding the `.wit` files.
        dir: PathBuf,
    },
    /// Generate a world's C bindings, as `wit-bindgen c` 0.60 does.
    CBindings {
        /// The directory holding the `.wit` files.
        dir: PathBuf,
        /// The world to generate bindings for.
        #[arg(short, long)]
        world: String,
        /// The folder to write the `.h`, `.c` and `_component_type.o` files
        /// into (created when missing).
        #[arg(short, long)]
        out_dir: PathBuf,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("inlay-componentize: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Encode {
            input,
            output,
            export,
            wit,
            world,
        } => {
            let mut core = read(&input)?;
            if let Some(dir) = wit {
                core = inlay_componentize::embed_world(&core, &dir, &world)
                    .with_context(|| format!("{}", dir.display()))?;
            }
            let component = inlay_componentize::componentize_exporting(&core, &export)
                .with_context(|| format!("{}", input.display()))?;
            write_atomically(&output, &component)?;
            println!(
                "{} -> {} ({} bytes)",
                input.display(),
                output.display(),
                component.len()
            );
        }
        Command::Check { files, export } => {
            for file in files {
                let bytes = read(&file)?;
                let info = inlay_componentize::check_component_exporting(&bytes, &export)
                    .with_context(|| format!("{}", file.display()))?;
                println!(
                    "{}: ok, {} bytes, imports [{}]",
                    file.display(),
                    bytes.len(),
                    info.imports.join(", ")
                );
            }
        }
        Command::Wit { dir } => {
            let worlds = inlay_componentize::check_wit(&dir)
                .with_context(|| format!("{}", dir.display()))?;
            println!("{}: ok, worlds [{}]", dir.display(), worlds.join(", "));
        }
        Command::CBindings {
            dir,
            world,
            out_dir,
        } => {
            let files = inlay_componentize::c_bindings(&dir, &world)
                .with_context(|| format!("{}", dir.display()))?;
            std::fs::create_dir_all(&out_dir)
                .with_context(|| format!("creating {}", out_dir.display()))?;
            for file in files {
                let path = out_dir.join(&file.name);
                std::fs::write(&path, &file.contents)
                    .with_context(|| format!("writing {}", path.display()))?;
                println!("{}", path.display());
            }
        }
    }
    Ok(())
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// Write through a temporary file in the same folder and rename it, so a
/// running host never loads a half-written component.
fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension("wasm.tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

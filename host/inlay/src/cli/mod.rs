//! The `inlay` command line: varnishd-style quick flags over a TOML file.
//! It only parses: each subcommand is run by the module that does it
//! ([`startup`](crate::startup) serves and checks, the admin client asks a
//! running inlay, [`manpage`] writes the man pages).

pub mod manpage;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::{Config, ConfigSource, Overrides};

/// Inlay: a WebAssembly edge-worker runtime for HTTP caching and page assembly.
#[derive(Debug, Parser)]
#[command(name = "inlay", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve HTTP in front of the configured backends.
    Serve(ServeArgs),
    /// Validate a configuration file and exit (0 when valid).
    Check {
        /// The TOML file to check.
        #[arg(long)]
        config: PathBuf,
    },
    /// Print the embedded default configuration.
    DefaultConfig,
    /// Ask a running inlay's admin API (stats, purge, ban, reload, ...).
    Admin(crate::admin::client::AdminArgs),
    /// Write the man pages into DIR (the Debian package's build step).
    #[command(hide = true)]
    Manpages {
        /// An existing directory.
        dir: PathBuf,
    },
}

/// Flags of `inlay serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Listen address (repeatable), e.g. `-a 127.0.0.1:6081` or `-a :6081`;
    /// `-a https://:6443` listens for TLS (with `--tls-cert`/`--tls-key` or
    /// `[[server.tls]]`).
    #[arg(short = 'a', long = "listen", value_name = "ADDR")]
    pub listen: Vec<String>,
    /// The default backend, e.g. `-b http://127.0.0.1:8080` (or `https://` for TLS, verified against the system roots).
    #[arg(short = 'b', long = "backend", value_name = "URL")]
    pub backend: Option<String>,
    /// A `wasi:http/proxy` component (`.wasm`) served in-process as the
    /// default backend, behind the cache (instead of `-b URL`), as
    /// `wasmtime serve` runs one.
    #[arg(long, value_name = "APP.wasm", conflicts_with = "backend")]
    pub component: Option<PathBuf>,
    /// TOML configuration file; the embedded default is used without it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Policy component (`.wasm`).
    #[arg(long, value_name = "FILE.wasm")]
    pub policy: Option<PathBuf>,
    /// Directory of the persistent cache tier.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Admin API listen address.
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<String>,
    /// The TLS listeners' certificate chain (PEM), for every name: replaces
    /// `[[server.tls]]`. Needs `--tls-key`.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of `--tls-cert`.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
}

impl ServeArgs {
    /// Where the config comes from: the file (or the embedded default) and
    /// these flags over it, read at start and again at every reload.
    pub fn source(&self) -> ConfigSource {
        ConfigSource {
            file: self.config.clone(),
            overrides: self.overrides(),
        }
    }

    /// Load the config (file or embedded) and apply the quick flags.
    pub fn load_config(&self) -> anyhow::Result<Config> {
        Ok(self.source().load()?)
    }

    /// The quick flags, as overrides of the file (applied again at every reload).
    pub fn overrides(&self) -> Overrides {
        Overrides {
            listen: self.listen.clone(),
            backend: self.backend.clone(),
            component: self.component.clone(),
            policy: self.policy.clone(),
            no_policy: false,
            cache_dir: self.cache_dir.clone(),
            admin: self.admin.clone(),
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
        }
    }
}

/// Entry point of the binary: parse the flags and run what they say; the
/// exit code is the subcommand's.
pub fn main() -> std::process::ExitCode {
    match Cli::parse().command {
        Command::Serve(args) => crate::startup::main(args.source()),
        Command::Check { config } => crate::startup::check(&config),
        Command::DefaultConfig => {
            print!("{}", crate::config::EMBEDDED_DEFAULT);
            std::process::ExitCode::SUCCESS
        }
        Command::Admin(args) => crate::admin::client::main(args),
        Command::Manpages { dir } => match manpage::write_manpages(&dir) {
            Ok(_) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!(
                    "inlay: cannot write the man pages into {}: {e}",
                    dir.display()
                );
                std::process::ExitCode::FAILURE
            }
        },
    }
}

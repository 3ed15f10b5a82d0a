//! Mint a token for the auth policy:
//! `cargo run -p policy-auth --example mint -- <key> <path> [ttl-seconds]`
//! (ttl defaults to 3600).

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (key, path, ttl) = match args.as_slice() {
        [key, path] => (key, path, Ok(3600)),
        [key, path, ttl] => (key, path, ttl.parse::<u64>()),
        _ => {
            eprintln!("usage: mint <key> <path> [ttl-seconds]");
            return ExitCode::FAILURE;
        }
    };
    let Ok(ttl) = ttl else {
        eprintln!("ttl must be a whole number of seconds");
        return ExitCode::FAILURE;
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    println!(
        "{}",
        policy_auth::mint_token(key.as_bytes(), path, now.saturating_add(ttl))
    );
    ExitCode::SUCCESS
}

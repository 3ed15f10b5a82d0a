//! Signed, expiring access tokens checked at the edge.
//!
//! A token is `<expiry>.<signature>`: `expiry` is a Unix time in seconds
//! (decimal), `signature` is the lower-case hex HMAC-SHA256, keyed with the
//! policy config value `key`, of the text `<expiry>:<path>` (`path` is the
//! request path without the query, as the policy sees it). It comes from
//! `Authorization: Bearer <token>` or from the query parameter `token=`.
//! A missing, malformed, wrongly signed or expired token gets a synthetic
//! 403; a valid one passes to the origin (authenticated content is not
//! cached). Without a configured `key` every request is refused.
//!
//! ```
//! use policy_auth::{mint_token, verify_token};
//!
//! let token = mint_token(b"secret", "/videos/1.mp4", 1_700_000_600);
//! assert!(verify_token(b"secret", "/videos/1.mp4", &token, 1_700_000_000).is_ok());
//! assert!(verify_token(b"secret", "/videos/2.mp4", &token, 1_700_000_000).is_err());
//! ```

use hmac::{Hmac, Mac};
use inlay_policy::{Action, Policy, Request, clock, config, log};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Why a token was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum TokenError {
    /// No token in the `Authorization` header or the query.
    Missing,
    /// Not `<digits>.<hex>`.
    Malformed,
    /// The signature does not match the path and expiry.
    BadSignature,
    /// The expiry is in the past.
    Expired,
}

/// The signature of `<expiry>:<path>` with `key`.
fn mac(key: &[u8], expiry: &str, path: &str) -> HmacSha256 {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = HmacSha256::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    mac.update(expiry.as_bytes());
    mac.update(b":");
    mac.update(path.as_bytes());
    mac
}

/// Make a token for `path` valid until `expiry_unix` (seconds).
pub fn mint_token(key: &[u8], path: &str, expiry_unix: u64) -> String {
    let expiry = expiry_unix.to_string();
    let signature = mac(key, &expiry, path).finalize().into_bytes();
    format!("{expiry}.{}", hex::encode(signature))
}

/// Check a token for `path` at time `now_unix` (seconds). The signature is
/// compared in constant time, before the expiry, so a forged token learns
/// nothing from the answer.
pub fn verify_token(key: &[u8], path: &str, token: &str, now_unix: u64) -> Result<(), TokenError> {
    let (expiry_text, signature_hex) = token.split_once('.').ok_or(TokenError::Malformed)?;
    if expiry_text.is_empty()
        || expiry_text.len() > 20
        || !expiry_text.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(TokenError::Malformed);
    }
    let expiry: u64 = expiry_text.parse().map_err(|_| TokenError::Malformed)?;
    // SHA-256 gives 32 bytes: exactly 64 hex digits.
    if signature_hex.len() != 64 {
        return Err(TokenError::Malformed);
    }
    let signature = hex::decode(signature_hex).map_err(|_| TokenError::Malformed)?;
    mac(key, expiry_text, path)
        .verify_slice(&signature)
        .map_err(|_| TokenError::BadSignature)?;
    if expiry < now_unix {
        return Err(TokenError::Expired);
    }
    Ok(())
}

/// The token of a request: `Authorization: Bearer`, else the `token` query
/// parameter.
pub fn token_of(req: &Request) -> Option<String> {
    if let Some(auth) = req.header("authorization") {
        let (scheme, token) = auth.trim().split_once(' ').unwrap_or((auth.trim(), ""));
        if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() {
            return Some(token.trim().to_owned());
        }
    }
    req.query()?
        .split('&')
        .find_map(|param| param.strip_prefix("token="))
        .filter(|token| !token.is_empty())
        .map(str::to_owned)
}

/// The auth policy; reads `key` once per instance.
pub struct Auth {
    key: Option<Vec<u8>>,
}

impl Default for Auth {
    fn default() -> Self {
        let key = config::get("key").filter(|k| !k.is_empty());
        if key.is_none() {
            log::error("auth policy: no `key` in the policy config; refusing every request");
        }
        Auth {
            key: key.map(String::into_bytes),
        }
    }
}

/// The answer to a refused request.
fn forbidden() -> Action {
    Action::synthetic(403)
        .header("content-type", "text/plain; charset=utf-8")
        .header("cache-control", "no-store")
        .body("Forbidden: missing, invalid or expired token\n")
        .into()
}

impl Policy for Auth {
    fn on_request(&self, req: &Request) -> Action {
        let Some(key) = &self.key else {
            return forbidden();
        };
        let result = token_of(req)
            .ok_or(TokenError::Missing)
            .and_then(|token| verify_token(key, &req.path(), &token, clock::now_unix_secs()));
        match result {
            Ok(()) => Action::Pass,
            Err(reason) => {
                log::debug(format_args!("auth: refused {}: {reason:?}", req.path()));
                forbidden()
            }
        }
    }
}

inlay_policy::export!(Auth);

#[cfg(test)]
mod tests {
    use super::*;
    use inlay_policy::testing;

    const NOW: u64 = 1_700_000_000;

    fn policy() -> Auth {
        testing::set_config("key", "k3y");
        testing::set_now_unix_ms(NOW * 1000);
        Auth::default()
    }

    fn is_forbidden(action: &Action) -> bool {
        matches!(action, Action::Synthetic(r) if r.status == 403 && !r.body.is_empty())
    }

    #[test]
    fn known_answer() {
        // HMAC-SHA256("k3y", "1700000000:/a"), from Python's hmac module.
        assert_eq!(
            mint_token(b"k3y", "/a", NOW),
            "1700000000.32ce687f9460545d4836017a66761b5b0027f6609333414d1cecb38a79949361"
        );
    }

    #[test]
    fn bearer_and_query_tokens_pass() {
        let policy = policy();
        let token = mint_token(b"k3y", "/video.mp4", NOW + 60);
        let bearer = Request::builder()
            .url("/video.mp4?q=1")
            .header("Authorization", &format!("Bearer {token}"))
            .build();
        assert_eq!(policy.on_request(&bearer), Action::Pass);
        let query = Request::new_local("GET", &format!("/video.mp4?a=1&token={token}"));
        assert_eq!(policy.on_request(&query), Action::Pass);
    }

    #[test]
    fn expiry_is_inclusive_then_refused() {
        let policy = policy();
        let at_now = mint_token(b"k3y", "/x", NOW);
        assert_eq!(
            policy.on_request(&Request::new_local("GET", &format!("/x?token={at_now}"))),
            Action::Pass
        );
        let past = mint_token(b"k3y", "/x", NOW - 1);
        assert_eq!(
            verify_token(b"k3y", "/x", &past, NOW),
            Err(TokenError::Expired)
        );
        assert!(is_forbidden(&policy.on_request(&Request::new_local(
            "GET",
            &format!("/x?token={past}")
        ))));
    }

    #[test]
    fn wrong_path_key_or_tampering_is_refused() {
        let token = mint_token(b"k3y", "/x", NOW + 60);
        assert_eq!(
            verify_token(b"k3y", "/y", &token, NOW),
            Err(TokenError::BadSignature)
        );
        assert_eq!(
            verify_token(b"other", "/x", &token, NOW),
            Err(TokenError::BadSignature)
        );
        let later = token.replacen(&(NOW + 60).to_string(), &(NOW + 9999).to_string(), 1);
        assert_eq!(
            verify_token(b"k3y", "/x", &later, NOW),
            Err(TokenError::BadSignature)
        );
    }

    #[test]
    fn malformed_tokens_are_refused() {
        for token in [
            "",
            "123",
            "abc.00",
            "-1.00",
            "1.zz",
            "1.",
            ".00",
            "+5.00",
            "99999999999999999999999.00",
        ] {
            assert_eq!(
                verify_token(b"k3y", "/x", token, NOW),
                Err(TokenError::Malformed),
                "{token:?}"
            );
        }
    }

    #[test]
    fn missing_token_or_key_gets_403() {
        let policy = policy();
        assert!(is_forbidden(
            &policy.on_request(&Request::new_local("GET", "/x"))
        ));
        let basic = Request::builder()
            .url("/x")
            .header("authorization", "Basic eDp5")
            .build();
        assert!(is_forbidden(&policy.on_request(&basic)));

        testing::remove_config("key");
        let no_key = Auth::default();
        let token = mint_token(b"k3y", "/x", NOW + 60);
        assert!(is_forbidden(&no_key.on_request(&Request::new_local(
            "GET",
            &format!("/x?token={token}")
        ))));
        assert!(
            testing::logs()
                .iter()
                .any(|(_, line)| line.contains("no `key`"))
        );
    }
}

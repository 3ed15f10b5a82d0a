//! A redirect table answered at the edge, read from the policy config.
//!
//! Every config key that starts with `/` is a rule; its value is
//! `[<status> ]<location>`, with status 301, 302, 303, 307 or 308 (301 when
//! left out):
//!
//! ```toml
//! [policy.config]
//! "/old" = "301 /new"
//! "/promo" = "302 https://shop.example/sale"
//! "/blog/*" = "308 /news/*"
//! ```
//!
//! A key is matched against the request path (without the query). A key
//! ending in `*` matches every path with that prefix, and a `*` in its
//! location is replaced by the rest of the path. Exact keys win over
//! prefixes, and longer prefixes over shorter ones. When the location has
//! no query, the request's query is kept. Bad rules are logged and skipped;
//! other config keys are ignored.

use inlay_policy::{Action, Policy, Request, builtin, config, log};

/// One redirect rule.
#[derive(Debug, PartialEq, Eq)]
pub struct Rule {
    /// The path, or the prefix when `prefix` is set (without the `*`).
    pub from: String,
    /// Whether `from` is a prefix.
    pub prefix: bool,
    /// The redirect status.
    pub status: u16,
    /// The `Location`, maybe with a `*` for the rest of the path.
    pub to: String,
}

/// Why a rule was skipped.
#[derive(Debug, PartialEq, Eq)]
pub enum RuleError {
    /// The status is not 301, 302, 303, 307 or 308.
    BadStatus(String),
    /// The location is empty or has whitespace or control characters.
    BadLocation(String),
}

/// Parse one rule from a config key and value.
pub fn parse_rule(key: &str, value: &str) -> Result<Rule, RuleError> {
    let value = value.trim();
    let (status, to) = match value.split_once(char::is_whitespace) {
        Some((first, rest)) if first.bytes().all(|b| b.is_ascii_digit()) => {
            let status = match first.parse::<u16>() {
                Ok(s @ (301 | 302 | 303 | 307 | 308)) => s,
                _ => return Err(RuleError::BadStatus(first.to_owned())),
            };
            (status, rest.trim())
        }
        _ if value.bytes().all(|b| b.is_ascii_digit()) => {
            return Err(RuleError::BadLocation(value.to_owned()));
        }
        _ => (301, value),
    };
    if to.is_empty() || to.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(RuleError::BadLocation(to.to_owned()));
    }
    let (from, prefix) = match key.strip_suffix('*') {
        Some(from) => (from, true),
        None => (key, false),
    };
    Ok(Rule {
        from: from.to_owned(),
        prefix,
        status,
        to: to.to_owned(),
    })
}

/// The rules of a config, in match order: exact paths, then prefixes from
/// longest to shortest. Bad rules are logged and skipped.
pub fn rules_from(config: &[(String, String)]) -> Vec<Rule> {
    let mut rules: Vec<Rule> = config
        .iter()
        .filter(|(key, _)| key.starts_with('/'))
        .filter_map(|(key, value)| match parse_rule(key, value) {
            Ok(rule) => Some(rule),
            Err(err) => {
                log::warn(format_args!("redirects: skipping rule {key:?}: {err:?}"));
                None
            }
        })
        .collect();
    rules.sort_by_key(|rule| (rule.prefix, std::cmp::Reverse(rule.from.len())));
    rules
}

/// Where `path` (with `query`) redirects to under `rules`, if anywhere.
pub fn resolve(rules: &[Rule], path: &str, query: Option<&str>) -> Option<(u16, String)> {
    let rule = rules.iter().find(|rule| {
        if rule.prefix {
            path.starts_with(&rule.from)
        } else {
            path == rule.from
        }
    })?;
    let mut location = if rule.prefix {
        rule.to.replacen('*', &path[rule.from.len()..], 1)
    } else {
        rule.to.clone()
    };
    if let Some(query) = query.filter(|q| !q.is_empty() && !location.contains('?')) {
        location.push('?');
        location.push_str(query);
    }
    Some((rule.status, location))
}

/// The redirects policy; parses the table once per instance.
pub struct Redirects {
    rules: Vec<Rule>,
}

impl Default for Redirects {
    fn default() -> Self {
        Redirects {
            rules: rules_from(&config::all()),
        }
    }
}

impl Policy for Redirects {
    fn on_request(&self, req: &Request) -> Action {
        match resolve(&self.rules, &req.path(), req.query().as_deref()) {
            Some((status, location)) => Action::redirect(status, &location),
            None => builtin::recv(req),
        }
    }
}

inlay_policy::export!(Redirects);

#[cfg(test)]
mod tests {
    use super::*;
    use inlay_policy::testing;

    fn location(action: &Action) -> Option<(u16, String)> {
        match action {
            Action::Synthetic(r) => Some((r.status, r.header_value("location")?.to_owned())),
            _ => None,
        }
    }

    fn policy() -> Redirects {
        for (k, v) in [
            ("/old", "301 /new"),
            ("/promo", "302 https://shop.example/sale"),
            ("/blog/*", "308 /news/*"),
            ("/blog/special", "/special"),
            ("/bl*", "307 /bee"),
            ("/bad", "200 /nope"),
            ("/bad2", "301 has space"),
            ("greeting", "not a rule"),
        ] {
            testing::set_config(k, v);
        }
        Redirects::default()
    }

    #[test]
    fn exact_rules_redirect_with_their_status() {
        let p = policy();
        assert_eq!(
            location(&p.on_request(&Request::new_local("GET", "/old"))),
            Some((301, "/new".into()))
        );
        assert_eq!(
            location(&p.on_request(&Request::new_local("GET", "/promo"))),
            Some((302, "https://shop.example/sale".into()))
        );
        assert_eq!(
            location(&p.on_request(&Request::new_local("GET", "/blog/special"))),
            Some((301, "/special".into()))
        );
    }

    #[test]
    fn prefixes_substitute_the_rest_and_longest_wins() {
        let p = policy();
        assert_eq!(
            location(&p.on_request(&Request::new_local("GET", "/blog/2024/post"))),
            Some((308, "/news/2024/post".into()))
        );
        assert_eq!(
            location(&p.on_request(&Request::new_local("GET", "/blx"))),
            Some((307, "/bee".into()))
        );
    }

    #[test]
    fn query_is_kept_unless_the_location_has_one() {
        let p = policy();
        assert_eq!(
            location(&p.on_request(&Request::new_local("GET", "/old?a=1"))),
            Some((301, "/new?a=1".into()))
        );
        let rules = vec![parse_rule("/q", "302 /r?x=1").unwrap()];
        assert_eq!(
            resolve(&rules, "/q", Some("a=1")),
            Some((302, "/r?x=1".into()))
        );
    }

    #[test]
    fn other_paths_follow_builtin_rules() {
        let p = policy();
        assert_eq!(
            p.on_request(&Request::new_local("GET", "/other")),
            Action::Lookup
        );
        assert_eq!(
            p.on_request(&Request::new_local("POST", "/other")),
            Action::Pass
        );
        assert_eq!(
            p.on_request(&Request::new_local("GET", "/oldx")),
            Action::Lookup
        );
    }

    #[test]
    fn bad_rules_are_skipped_and_logged() {
        let p = policy();
        assert_eq!(
            p.on_request(&Request::new_local("GET", "/bad")),
            Action::Lookup
        );
        let warnings = testing::logs()
            .into_iter()
            .filter(|(_, l)| l.contains("skipping rule"))
            .count();
        assert_eq!(warnings, 2);
        assert_eq!(
            parse_rule("/x", "301"),
            Err(RuleError::BadLocation("301".into()))
        );
        assert_eq!(
            parse_rule("/x", "999 /y"),
            Err(RuleError::BadStatus("999".into()))
        );
    }
}

//! `[cluster]`: the NATS servers a node joins, how it authenticates, its
//! name, and what the cluster shares. Without the table nothing changes.

use std::path::PathBuf;
use std::time::Duration;

pub use inlay_cluster::config::{
    ClusterAuth, ClusterConfig, ClusterKv, ClusterTls, InvalidationConfig, ShardConfig,
};

use super::read::{Reader, Table, join};

/// Longest `node_name` and `subject_prefix`: subjects stay short.
const MAX_NAME: usize = 64;

fn valid_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The host's name as a node name: its first label, kept to the characters
/// a subject token may hold.
fn default_node_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let name: String = raw
        .trim()
        .split('.')
        .next()
        .unwrap_or("")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(MAX_NAME)
        .collect();
    if name.is_empty() {
        "inlay".to_owned()
    } else {
        name
    }
}

impl Reader {
    /// `[cluster]`, or `None` when the table is absent.
    pub(super) fn cluster(&mut self, t: &Table) -> Option<ClusterConfig> {
        let p = "cluster";
        let nats_urls = self.strings(t, p, "nats_urls").unwrap_or_default();
        if nats_urls.is_empty() {
            self.err(
                join(p, "nats_urls"),
                "at least one NATS server is required, e.g. [\"nats://127.0.0.1:4222\"]",
            );
        }
        for (i, url) in nats_urls.iter().enumerate() {
            if let Err(m) = check_nats_url(url) {
                self.err(format!("{p}.nats_urls[{i}]"), m);
            }
        }
        let node_name = self
            .string(t, p, "node_name")
            .unwrap_or_else(default_node_name);
        if !valid_token(&node_name) {
            self.err(
                join(p, "node_name"),
                format!(
                    "{node_name:?}: use 1 to {MAX_NAME} letters, digits, '-' and '_' (it is a NATS subject token)"
                ),
            );
        }
        let subject_prefix = self
            .string(t, p, "subject_prefix")
            .unwrap_or_else(|| "inlay".to_owned());
        if !valid_token(&subject_prefix) {
            self.err(
                join(p, "subject_prefix"),
                format!(
                    "{subject_prefix:?}: use 1 to {MAX_NAME} letters, digits, '-' and '_' (it names subjects and streams)"
                ),
            );
        }
        let shard = self.boolean(t, p, "shard", false);
        let mut auths = Vec::new();
        for (key, make) in [
            (
                "token_file",
                ClusterAuth::Token as fn(PathBuf) -> ClusterAuth,
            ),
            ("nkey_seed_file", ClusterAuth::NKey),
            ("credentials_file", ClusterAuth::Credentials),
        ] {
            if let Some(path) = self.string(t, p, key) {
                if path.is_empty() {
                    self.err(join(p, key), "must name a file");
                } else {
                    auths.push((key, make(PathBuf::from(path))));
                }
            }
        }
        if auths.len() > 1 {
            let keys: Vec<_> = auths.iter().map(|(k, _)| *k).collect();
            self.err(
                p,
                format!(
                    "give one of token_file, nkey_seed_file and credentials_file, not {}",
                    keys.join(" and ")
                ),
            );
        }
        let auth = auths.pop().map(|(_, a)| a).unwrap_or_default();
        let tls = self.table(t, p, "tls").map(|tt| self.cluster_tls(tt));
        let connect_timeout =
            self.positive_duration(t, p, "connect_timeout", Duration::from_secs(2));
        let (kv, kv_max_bytes, policy_max_size) = self.cluster_kv_and_rollout(t, p);
        let sharding = self.cluster_sharding(t);
        let section = ClusterConfig {
            nats_urls,
            node_name,
            subject_prefix,
            shard,
            auth,
            tls,
            connect_timeout,
            invalidations: self.cluster_invalidations(t, p),
            kv,
            kv_max_bytes,
            policy_max_size,
            sharding,
        };
        self.unknown_keys(t, p);
        Some(section)
    }

    fn cluster_tls(&mut self, t: &Table) -> ClusterTls {
        let p = "cluster.tls";
        let ca_file = self.string(t, p, "ca_file").map(PathBuf::from);
        let cert = self.string(t, p, "client_cert").map(PathBuf::from);
        let key = self.string(t, p, "client_key").map(PathBuf::from);
        let client_cert = match (cert, key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => {
                self.err(p, "client_cert and client_key go together");
                None
            }
        };
        let section = ClusterTls {
            ca_file,
            client_cert,
        };
        self.unknown_keys(t, p);
        section
    }

    /// `advertise`, `heartbeat_interval`, `dead_after`, `peer_connect_timeout`.
    fn cluster_sharding(&mut self, t: &Table) -> ShardConfig {
        let p = "cluster";
        let advertise =
            self.string(t, p, "advertise")
                .and_then(|a| match a.parse::<std::net::SocketAddr>() {
                    Ok(addr) if addr.ip().is_unspecified() || addr.port() == 0 => {
                        self.err(
                            join(p, "advertise"),
                            format!("{a:?}: give the address and port peers reach this node at"),
                        );
                        None
                    }
                    Ok(addr) => Some(addr),
                    Err(_) => {
                        self.err(
                            join(p, "advertise"),
                            format!("{a:?} is not IP:PORT (e.g. \"10.0.0.5:6081\")"),
                        );
                        None
                    }
                });
        let heartbeat_interval =
            self.positive_duration(t, p, "heartbeat_interval", Duration::from_secs(1));
        let dead_after = self.positive_duration(t, p, "dead_after", heartbeat_interval * 3);
        if dead_after <= heartbeat_interval {
            self.err(
                join(p, "dead_after"),
                "must be longer than heartbeat_interval (one late heartbeat is not a death)",
            );
        }
        let peer_connect_timeout =
            self.positive_duration(t, p, "peer_connect_timeout", Duration::from_millis(500));
        ShardConfig {
            advertise,
            heartbeat_interval,
            dead_after,
            peer_connect_timeout,
        }
    }

    /// With `shard = true` and no `advertise`, the first `server.listen`
    /// address is what peers use: it must be one they can reach.
    pub(super) fn cluster_advertised(
        &mut self,
        cluster: Option<&ClusterConfig>,
        listen: &[std::net::SocketAddr],
    ) {
        if !cluster.is_some_and(|c| c.shard && c.sharding.advertise.is_none()) {
            return;
        }
        match listen.first() {
            Some(a) if !a.ip().is_unspecified() => {}
            first => self.err(
                "cluster.advertise",
                format!(
                    "shard = true needs the address peers reach this node at: set cluster.advertise, or make the first server.listen address concrete (it is {})",
                    first.map_or("absent".to_owned(), |a| a.to_string())
                ),
            ),
        }
    }
}

impl Reader {
    /// The `invalidation_*` keys of `[cluster]` (purge and ban fan-out).
    fn cluster_invalidations(&mut self, t: &Table, p: &str) -> InvalidationConfig {
        let d = InvalidationConfig::default();
        let max_age = self.positive_duration(t, p, "invalidation_max_age", d.max_age);
        const YEAR: Duration = Duration::from_secs(365 * 86_400);
        if max_age > YEAR {
            self.err(
                join(p, "invalidation_max_age"),
                "at most \"365d\" (a node away longer starts empty anyway)",
            );
        }
        let max_messages = self.uint(
            t,
            p,
            "invalidation_max_messages",
            d.max_messages,
            1,
            1 << 40,
        );
        let queue = self.uint(t, p, "invalidation_queue", d.queue as u64, 1, 10_000_000) as usize;
        let max_disconnected = self.duration(t, p, "max_disconnected", d.max_disconnected);
        if !max_disconnected.is_zero() && max_disconnected < MIN_DISCONNECTED {
            self.err(
                join(p, "max_disconnected"),
                "at least \"2s\" (the node checks that it is in touch every second), or \"0s\" for no limit",
            );
        }
        InvalidationConfig {
            max_age: max_age.min(YEAR),
            max_messages,
            queue,
            max_disconnected: if max_disconnected < MIN_DISCONNECTED {
                Duration::ZERO
            } else {
                max_disconnected
            },
        }
    }

    /// `cluster.kv`, `cluster.kv_max_bytes` and `cluster.policy_max_size`.
    fn cluster_kv_and_rollout(&mut self, t: &Table, p: &str) -> (ClusterKv, u64, u64) {
        let kv = match self.string(t, p, "kv").as_deref() {
            None | Some("local") => ClusterKv::Local,
            Some("nats") => ClusterKv::Nats,
            Some(other) => {
                self.err(
                    join(p, "kv"),
                    format!("{other:?}: expected \"local\" or \"nats\""),
                );
                ClusterKv::Local
            }
        };
        let kv_max_bytes = self.size(t, p, "kv_max_bytes", 64 << 20);
        let policy_max_size = self.size(t, p, "policy_max_size", 64 << 20);
        for (key, value) in [
            ("kv_max_bytes", kv_max_bytes),
            ("policy_max_size", policy_max_size),
        ] {
            if value == 0 {
                self.err(join(p, key), "must be more than 0");
            } else if value > MAX_CLUSTER_BYTES {
                self.err(join(p, key), "at most 1GiB");
            }
        }
        (kv, kv_max_bytes, policy_max_size)
    }
}

/// Shortest non-zero `max_disconnected`: the node confirms that it is in
/// touch every second.
const MIN_DISCONNECTED: Duration = Duration::from_secs(2);

/// Largest `kv_max_bytes` and `policy_max_size`: both are held in memory.
const MAX_CLUSTER_BYTES: u64 = 1 << 30;

/// A NATS server address: `nats://`, `tls://` (or `ws://`/`wss://`) with a
/// host and a port.
fn check_nats_url(s: &str) -> Result<(), String> {
    let uri: http::Uri = s.parse().map_err(|e| format!("{s:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("nats" | "tls") => {}
        Some(other) => {
            return Err(format!(
                "{s:?}: scheme {other:?}, expected nats:// or tls://"
            ));
        }
        None => return Err(format!("{s:?}: expected nats://HOST:PORT")),
    }
    match uri.authority() {
        Some(a) if !a.host().is_empty() => Ok(()),
        _ => Err(format!("{s:?}: no host")),
    }
}

#[cfg(test)]
mod tests {
    use crate::Config;

    const BACKEND: &str = "[backends.default]\naddress = \"http://127.0.0.1:8080\"\n";

    fn issues(cluster: &str) -> Vec<String> {
        match Config::from_toml(&format!("{BACKEND}[cluster]\n{cluster}")) {
            Ok(_) => Vec::new(),
            Err(e) => vec![e.to_string()],
        }
    }

    #[test]
    fn without_a_cluster_table_there_is_no_cluster() {
        assert!(Config::from_toml(BACKEND).unwrap().cluster.is_none());
    }

    #[test]
    fn a_cluster_table_parses_with_defaults() {
        let cfg = Config::from_toml(&format!(
            "{BACKEND}[cluster]\nnats_urls = [\"nats://127.0.0.1:4222\", \"tls://nats.example:4443\"]\nnode_name = \"edge-1\"\n"
        ))
        .unwrap();
        let c = cfg.cluster.unwrap();
        assert_eq!(c.nats_urls.len(), 2);
        assert_eq!(c.node_name, "edge-1");
        assert_eq!(c.subject_prefix, "inlay");
        assert!(!c.shard);
        assert_eq!(c.auth, super::ClusterAuth::None);
        assert_eq!(c.connect_timeout, std::time::Duration::from_secs(2));
        assert_eq!(c.invalidations, super::InvalidationConfig::default());
    }

    #[test]
    fn invalidation_retention_parses_and_bad_values_are_named() {
        let cfg = Config::from_toml(&format!(
            "{BACKEND}[cluster]\nnats_urls = [\"nats://127.0.0.1:4222\"]\ninvalidation_max_age = \"2h\"\ninvalidation_max_messages = 5000\ninvalidation_queue = 7\nmax_disconnected = \"30s\"\n"
        ))
        .unwrap();
        let inv = cfg.cluster.unwrap().invalidations;
        assert_eq!(inv.max_age, std::time::Duration::from_secs(7200));
        assert_eq!((inv.max_messages, inv.queue), (5000, 7));
        assert_eq!(inv.max_disconnected, std::time::Duration::from_secs(30));
        let all = issues(
            "nats_urls = [\"nats://127.0.0.1:4222\"]\ninvalidation_max_age = \"0s\"\ninvalidation_max_messages = 0\ninvalidation_queue = -1\nmax_disconnected = \"500ms\"\n",
        )
        .join("\n");
        for needle in [
            "cluster.invalidation_max_age",
            "cluster.invalidation_max_messages",
            "cluster.invalidation_queue",
            "cluster.max_disconnected",
        ] {
            assert!(all.contains(needle), "{needle} not in:\n{all}");
        }
    }

    #[test]
    fn bad_cluster_settings_are_named_with_their_path() {
        let all = issues(
            "nats_urls = [\"http://x:1\", \"nats://\"]\nnode_name = \"a.b\"\nsubject_prefix = \"\"\ntoken_file = \"t\"\nnkey_seed_file = \"n\"\nflavour = 1\n[cluster.tls]\nclient_cert = \"c.pem\"\n",
        )
        .join("\n");
        for needle in [
            "cluster.nats_urls[0]",
            "cluster.nats_urls[1]",
            "cluster.node_name",
            "cluster.subject_prefix",
            "not token_file and nkey_seed_file",
            "cluster.flavour",
            "client_cert and client_key go together",
        ] {
            assert!(all.contains(needle), "{needle} not in:\n{all}");
        }
        assert!(issues("").join("\n").contains("at least one NATS server"));
    }

    #[test]
    fn the_shared_kv_and_rollout_settings_parse_and_bad_ones_are_named() {
        let cfg = Config::from_toml(&format!(
            "{BACKEND}[cluster]\nnats_urls = [\"nats://127.0.0.1:4222\"]\nkv = \"nats\"\nkv_max_bytes = \"8MiB\"\npolicy_max_size = \"16MiB\"\n"
        ))
        .unwrap();
        let c = cfg.cluster.unwrap();
        assert_eq!(c.kv, super::ClusterKv::Nats);
        assert_eq!((c.kv_max_bytes, c.policy_max_size), (8 << 20, 16 << 20));
        let all = issues(
            "nats_urls = [\"nats://127.0.0.1:4222\"]\nkv = \"redis\"\nkv_max_bytes = 0\npolicy_max_size = \"2GiB\"\n",
        )
        .join("\n");
        for needle in [
            "cluster.kv: \"redis\"",
            "cluster.kv_max_bytes: must be more than 0",
            "cluster.policy_max_size: at most 1GiB",
        ] {
            assert!(all.contains(needle), "{needle} not in:\n{all}");
        }
    }

    #[test]
    fn sharding_needs_an_address_peers_can_reach() {
        let shard = "nats_urls = [\"nats://127.0.0.1:4222\"]\nshard = true\n";
        let wildcard =
            format!("[server]\nlisten = [\"0.0.0.0:6081\"]\n{BACKEND}[cluster]\n{shard}");
        let e = Config::from_toml(&wildcard).unwrap_err().to_string();
        assert!(
            e.contains("cluster.advertise") && e.contains("0.0.0.0:6081"),
            "{e}"
        );
        let advertised = format!("{wildcard}advertise = \"10.0.0.5:6081\"\n");
        let c = Config::from_toml(&advertised).unwrap().cluster.unwrap();
        assert_eq!(c.sharding.advertise, Some("10.0.0.5:6081".parse().unwrap()));
        assert_eq!(c.sharding.dead_after, std::time::Duration::from_secs(3));
        let all = issues(&format!(
            "{shard}advertise = \"0.0.0.0:1\"\nheartbeat_interval = \"2s\"\ndead_after = \"1s\"\npeer_connect_timeout = \"0s\"\n"
        ))
        .join("\n");
        for needle in [
            "cluster.advertise",
            "cluster.dead_after",
            "cluster.peer_connect_timeout",
        ] {
            assert!(all.contains(needle), "{needle} not in:\n{all}");
        }
    }
}

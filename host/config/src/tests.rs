//! The config's unit tests: every section's defaults, bounds and errors.

use std::time::Duration;

use super::*;

#[test]
fn embedded_default_is_valid() {
    let c = Config::from_toml(EMBEDDED_DEFAULT).unwrap();
    assert_eq!(c.default_backend().name, "default");
}

#[test]
fn metrics_are_on_by_default_and_can_be_turned_off() {
    let backend = "[backends.default]\naddress = \"http://127.0.0.1:8080\"\n";
    assert!(Config::from_toml(backend).unwrap().metrics.enabled);
    let off = Config::from_toml(&format!("{backend}[metrics]\nenabled = false")).unwrap();
    assert!(!off.metrics.enabled);
    let err = Config::from_toml(&format!("{backend}[metrics]\nenabled = 1\nport = 9")).unwrap_err();
    let ConfigError::Invalid(issues) = err else {
        panic!("expected Invalid, got {err:?}")
    };
    let mut paths: Vec<_> = issues.iter().map(|i| i.path.as_str()).collect();
    paths.sort_unstable();
    assert_eq!(paths, ["metrics.enabled", "metrics.port"], "{issues:#?}");
    // The known keys come from what the section reads.
    let port = issues.iter().find(|i| i.path == "metrics.port").unwrap();
    assert!(port.message.ends_with("(known here: enabled)"), "{port:?}");
}

#[test]
fn disk_index_cache_is_optional_and_at_least_a_mib() {
    let backend = "[backends.default]\naddress = \"http://127.0.0.1:8080\"\n";
    assert_eq!(
        Config::from_toml(backend).unwrap().cache.disk_index_cache,
        None
    );
    let set = Config::from_toml(&format!("{backend}[cache]\ndisk_index_cache = \"64MiB\""));
    assert_eq!(set.unwrap().cache.disk_index_cache, Some(64 << 20));
    for bad in ["0", "1000", "\"lots\""] {
        let err =
            Config::from_toml(&format!("{backend}[cache]\ndisk_index_cache = {bad}")).unwrap_err();
        let ConfigError::Invalid(issues) = err else {
            panic!("expected Invalid, got {err:?}")
        };
        let paths: Vec<_> = issues.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(paths, ["cache.disk_index_cache"], "{bad}: {issues:#?}");
    }
}

#[test]
fn request_and_subrequest_body_bounds_parse() {
    let c = Config::from_toml(
        "[server]\nmax_request_body = \"1KiB\"\n[backends.default]\naddress = \"http://127.0.0.1:8080\"\n[policy]\npath = \"p.wasm\"\nmax_subrequest_bytes = \"2MiB\"",
    )
    .unwrap();
    assert_eq!(c.server.max_request_body, 1024);
    let pc = c.policy.as_ref().expect("policy");
    assert_eq!(pc.max_subrequest_bytes, 2 << 20);
    let d = Config::from_toml(EMBEDDED_DEFAULT).unwrap();
    assert_eq!(d.server.max_request_body, 64 << 20);
}

#[test]
fn request_id_and_server_timing_settings() {
    let d = Config::from_toml(EMBEDDED_DEFAULT).unwrap();
    assert_eq!(
        d.server.request_id_header.as_ref().map(|h| h.as_str()),
        Some("x-request-id")
    );
    assert!(d.server.trust_request_id);
    assert!(!d.server.server_timing);
    let backend = "[backends.default]\naddress = \"http://127.0.0.1:8080\"";
    let c = Config::from_toml(&format!(
        "[server]\nrequest_id_header = \"\"\ntrust_request_id = false\nserver_timing = true\n{backend}"
    ))
    .unwrap();
    assert!(c.server.request_id_header.is_none());
    assert!(!c.server.trust_request_id);
    assert!(c.server.server_timing);
    for bad in ["Host", "bad name", "Content-Length"] {
        let err = Config::from_toml(&format!("[server]\nrequest_id_header = {bad:?}\n{backend}"))
            .unwrap_err();
        let ConfigError::Invalid(issues) = err else {
            panic!("expected Invalid, got {err:?}")
        };
        assert_eq!(issues[0].path, "server.request_id_header", "{issues:#?}");
    }
}

#[test]
fn absurd_durations_are_rejected_with_their_path() {
    let text = r#"
        [server]
        idle_timeout = "1000000000000d"
        shutdown_timeout = 9223372036854775807
        [cache]
        default_ttl = "36500d"
        [backends.default]
        address = "http://127.0.0.1:8080"
    "#;
    let err = Config::from_toml(text).unwrap_err();
    let ConfigError::Invalid(issues) = err else {
        panic!("expected Invalid, got {err:?}")
    };
    let paths: Vec<_> = issues.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(
        paths,
        ["server.idle_timeout", "server.shutdown_timeout"],
        "{issues:#?}"
    );
    assert!(issues[0].message.contains("at most"), "{issues:#?}");
    // A century is accepted (a TTL of years is legitimate).
    let c = Config::from_toml(
        "[cache]\ndefault_ttl = \"36500d\"\n[backends.default]\naddress = \"http://127.0.0.1:8080\"",
    )
    .unwrap();
    assert_eq!(c.cache.default_ttl, Duration::from_secs(36_500 * 86_400));
}

#[test]
fn send_timeouts_have_defaults_and_must_not_be_zero() {
    let c = Config::from_toml(EMBEDDED_DEFAULT).unwrap();
    assert_eq!(c.server.send_timeout, Duration::from_secs(600));
    assert_eq!(c.server.idle_send_timeout, Duration::from_secs(60));
    let text = "[server]\nsend_timeout = \"0s\"\nidle_send_timeout = 0\n";
    let ConfigError::Invalid(issues) = Config::from_toml(text).unwrap_err() else {
        panic!("expected Invalid")
    };
    let paths: Vec<_> = issues.iter().map(|i| i.path.as_str()).collect();
    assert!(paths.contains(&"server.send_timeout"), "{issues:#?}");
    assert!(paths.contains(&"server.idle_send_timeout"), "{issues:#?}");
}

#[test]
fn every_error_is_reported_with_its_path_and_value() {
    let text = r#"
        [server]
        listen = ["nonsense"]
        idle_timeout = "forever"
        [backends.api]
        address = "ftp://x"
        connect_timeout = 3.5
        colour = "red"
    "#;
    let err = Config::from_toml(text).unwrap_err();
    let ConfigError::Invalid(issues) = err else {
        panic!("expected Invalid, got {err:?}")
    };
    let paths: Vec<_> = issues.iter().map(|i| i.path.as_str()).collect();
    for want in [
        "server.listen[0]",
        "server.idle_timeout",
        "backends.api.address",
        "backends.api.connect_timeout",
        "backends.api.colour",
    ] {
        assert!(paths.contains(&want), "missing {want} in {issues:#?}");
    }
    let text = format!("{}", ConfigError::Invalid(issues));
    assert!(text.contains("\"nonsense\""), "{text}");
    assert!(text.contains("forever"), "{text}");
}

#[test]
fn policy_replay_size_parses_and_bad_ones_are_named() {
    let base =
        "[backends.default]\naddress = \"http://127.0.0.1:1\"\n[policy]\npath = \"p.wasm\"\n";
    let c = Config::from_toml(base).unwrap();
    assert_eq!(c.policy.unwrap().memo_size, 16 << 20);
    let c = Config::from_toml(&format!("{base}memo_size = \"1MiB\"")).unwrap();
    assert_eq!(c.policy.unwrap().memo_size, 1 << 20);
    let c = Config::from_toml(&format!("{base}memo_size = 0")).unwrap();
    assert_eq!(c.policy.unwrap().memo_size, 0);
    let err = Config::from_toml(&format!("{base}memo_size = \"lots\"")).unwrap_err();
    assert!(err.to_string().contains("policy.memo_size"), "{err}");
    let c = Config::from_toml(base).unwrap();
    assert!(!c.policy.unwrap().replay_always);
    let c = Config::from_toml(&format!("{base}replay_always = true")).unwrap();
    assert!(c.policy.unwrap().replay_always);
    let err = Config::from_toml(&format!("{base}replay_always = \"yes\"")).unwrap_err();
    assert!(err.to_string().contains("policy.replay_always"), "{err}");
}

#[test]
fn policy_instance_reuse_parses_and_bad_ones_are_named() {
    let base =
        "[backends.default]\naddress = \"http://127.0.0.1:1\"\n[policy]\npath = \"p.wasm\"\n";
    let c = Config::from_toml(base).unwrap().policy.unwrap();
    assert_eq!(c.requests_per_instance, 1000);
    assert_eq!(c.instance_lifetime, Duration::from_secs(60));
    let c = Config::from_toml(&format!(
        "{base}requests_per_instance = 1\ninstance_lifetime = \"5s\""
    ))
    .unwrap()
    .policy
    .unwrap();
    assert_eq!(c.requests_per_instance, 1);
    assert_eq!(c.instance_lifetime, Duration::from_secs(5));
    for bad in ["requests_per_instance = 0", "instance_lifetime = \"often\""] {
        let err = Config::from_toml(&format!("{base}{bad}")).unwrap_err();
        let key = bad.split(' ').next().unwrap();
        assert!(err.to_string().contains(&format!("policy.{key}")), "{err}");
    }
}

#[test]
fn policy_instance_wait_parses_and_is_bounded() {
    let base =
        "[backends.default]\naddress = \"http://127.0.0.1:1\"\n[policy]\npath = \"p.wasm\"\n";
    let c = Config::from_toml(base).unwrap();
    assert_eq!(c.policy.unwrap().instance_wait, Duration::from_secs(1));
    let c = Config::from_toml(&format!("{base}instance_wait = \"250ms\"")).unwrap();
    assert_eq!(c.policy.unwrap().instance_wait, Duration::from_millis(250));
    let c = Config::from_toml(&format!("{base}instance_wait = 0")).unwrap();
    assert_eq!(c.policy.unwrap().instance_wait, Duration::ZERO);
    for bad in ["\"2h\"", "\"soon\""] {
        let err = Config::from_toml(&format!("{base}instance_wait = {bad}")).unwrap_err();
        assert!(
            err.to_string().contains("policy.instance_wait"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn policy_host_wait_parses_and_is_bounded() {
    let base =
        "[backends.default]\naddress = \"http://127.0.0.1:1\"\n[policy]\npath = \"p.wasm\"\n";
    let c = Config::from_toml(base).unwrap();
    assert_eq!(c.policy.unwrap().host_wait, Duration::from_secs(10));
    let c = Config::from_toml(&format!("{base}host_wait = \"2s\"")).unwrap();
    assert_eq!(c.policy.unwrap().host_wait, Duration::from_secs(2));
    for bad in ["0", "\"1h\"", "\"soon\""] {
        let err = Config::from_toml(&format!("{base}host_wait = {bad}")).unwrap_err();
        assert!(err.to_string().contains("policy.host_wait"), "{bad}: {err}");
    }
}

#[test]
fn pre_instantiation_is_on_unless_turned_off() {
    let base =
        "[backends.default]\naddress = \"http://127.0.0.1:1\"\n[policy]\npath = \"p.wasm\"\n";
    assert!(
        Config::from_toml(base)
            .unwrap()
            .policy
            .unwrap()
            .pre_instantiate
    );
    let c = Config::from_toml(&format!("{base}pre_instantiate = false")).unwrap();
    assert!(!c.policy.unwrap().pre_instantiate);
    let err = Config::from_toml(&format!("{base}pre_instantiate = \"no\"")).unwrap_err();
    assert!(err.to_string().contains("policy.pre_instantiate"), "{err}");
}

#[test]
fn esi_failures_are_left_out_unless_fail_is_asked_for() {
    let base = "[backends.default]\naddress = \"http://127.0.0.1:1\"\n[esi]\n";
    let c = Config::from_toml(base).unwrap();
    assert_eq!(c.esi.on_include_error, inlay_esi::OnIncludeError::Omit);
    let c = Config::from_toml(&format!("{base}on_include_error = \"fail\"")).unwrap();
    assert_eq!(c.esi.on_include_error, inlay_esi::OnIncludeError::Fail);
    let err = Config::from_toml(&format!("{base}on_include_error = \"cut\"")).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("esi.on_include_error"), "{text}");
    assert!(text.contains("\"cut\""), "{text}");
}

#[test]
fn esi_buffered_bytes_has_a_default_and_a_floor() {
    let base = "[backends.default]\naddress = \"http://127.0.0.1:1\"\n[esi]\n";
    let c = Config::from_toml(base).unwrap();
    assert_eq!(c.esi.max_buffered_bytes, 16 << 20);
    let c = Config::from_toml(&format!("{base}max_buffered_bytes = \"1MiB\"")).unwrap();
    assert_eq!(c.esi.max_buffered_bytes, 1 << 20);
    let err = Config::from_toml(&format!("{base}max_buffered_bytes = 10")).unwrap_err();
    assert!(err.to_string().contains("esi.max_buffered_bytes"), "{err}");
}

#[test]
fn syntax_errors_are_reported() {
    let err = Config::from_toml("[server\nlisten=").unwrap_err();
    assert!(matches!(err, ConfigError::Syntax(_)));
}

#[test]
fn quick_flags_override_the_file() {
    let mut c = Config::embedded_default();
    c.apply_overrides(&Overrides {
        listen: vec![":7000".into()],
        backend: Some("127.0.0.1:9000".into()),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(c.server.listen, vec!["0.0.0.0:7000".parse().unwrap()]);
    assert_eq!(c.default_backend().authority(), "127.0.0.1:9000");
}

#[test]
fn tls_listeners_and_certificates_parse_and_bad_ones_are_named() {
    let c = Config::from_toml(
        "[server]\nlisten = [\"127.0.0.1:6081\", \"https://127.0.0.1:6443\", \"http://:80\", \"h2c://127.0.0.1:6082\"]\n\
         [[server.tls]]\ncert = \"a.pem\"\nkey = \"a.key\"\nnames = [\"a.example\", \"*.b.example\"]\n\
         [[server.tls]]\ncert = \"d.pem\"\nkey = \"d.key\"\n\
         [backends.o]\naddress = \"http://127.0.0.1:8080\"\n",
    )
    .unwrap();
    let s = &c.server;
    assert_eq!(s.listen.len(), 2);
    assert_eq!(s.listen_tls, vec!["127.0.0.1:6443".parse().unwrap()]);
    assert_eq!(s.listen_h2c, vec!["127.0.0.1:6082".parse().unwrap()]);
    assert_eq!(s.tls.len(), 2);
    assert_eq!(s.tls[0].names, ["a.example", "*.b.example"]);
    assert!(s.tls[1].names.is_empty());

    let Err(ConfigError::Invalid(issues)) = Config::from_toml(
        "[server]\nlisten = [\"https://127.0.0.1:6443\", \"ftp://:1\"]\n\
         [[server.tls]]\ncert = \"a.pem\"\nnames = [\"A.example\"]\n\
         [[server.tls]]\ncert = \"b.pem\"\nkey = \"\"\nnames = [\"a.example\", \"a.example\"]\n\
         [[server.tls]]\ncert = \"c.pem\"\nkey = \"c.key\"\n\
         [[server.tls]]\ncert = \"d.pem\"\nkey = \"d.key\"\n\
         [backends.o]\naddress = \"http://127.0.0.1:8080\"\n",
    ) else {
        panic!("accepted")
    };
    let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "server.listen[1]",
            "server.tls[0].key",
            "server.tls[0].names[0]",
            "server.tls[1].key",
            "server.tls[1].names[1]",
            "server.tls[3].names",
        ],
        "{issues:?}"
    );
    let Err(ConfigError::Invalid(issues)) = Config::from_toml(
        "[server]\nlisten = [\"https://127.0.0.1:6443\"]\n\
         [backends.o]\naddress = \"http://127.0.0.1:8080\"\n",
    ) else {
        panic!("an https listener without a certificate was accepted")
    };
    assert_eq!(issues[0].path, "server.listen");
}

#[test]
fn quic_listeners_parse_need_a_certificate_and_ocsp_files_are_read_per_entry() {
    let backend = "[backends.o]\naddress = \"http://127.0.0.1:8080\"\n";
    let c = Config::from_toml(&format!(
        "[server]\nlisten = [\"https://:6443\", \"quic://:6443\"]\n\
         [[server.tls]]\ncert = \"a.pem\"\nkey = \"a.key\"\nocsp_file = \"a.ocsp\"\n{backend}"
    ))
    .unwrap();
    assert_eq!(c.server.listen_quic, vec!["0.0.0.0:6443".parse().unwrap()]);
    assert_eq!(c.server.listen_tls, c.server.listen_quic);
    assert_eq!(c.server.tls[0].ocsp, Some("a.ocsp".into()));
    let Err(ConfigError::Invalid(issues)) = Config::from_toml(&format!(
        "[server]\nlisten = [\"quic://127.0.0.1:6443\"]\n{backend}"
    )) else {
        panic!("a quic listener without a certificate was accepted")
    };
    assert_eq!(issues[0].path, "server.listen");
    assert!(
        issues[0]
            .message
            .starts_with("quic://127.0.0.1:6443 needs a certificate")
    );
    let Err(ConfigError::Invalid(issues)) = Config::from_toml(&format!(
        "[server]\nlisten = [\"https://:6443\"]\n\
         [[server.tls]]\ncert = \"a.pem\"\nkey = \"a.key\"\nocsp_file = \"\"\n{backend}"
    )) else {
        panic!("an empty ocsp_file was accepted")
    };
    assert_eq!(issues[0].path, "server.tls[0].ocsp_file");
}

#[test]
fn h2_limits_have_defaults_and_bounds() {
    let backend = "[backends.o]\naddress = \"http://127.0.0.1:8080\"\n";
    let s = Config::embedded_default().server;
    assert_eq!(s.h2_max_concurrent_streams, 256);
    assert_eq!(s.h2_max_header_list_size as usize, s.max_header_size);
    assert_eq!(s.h2_max_pending_accept_reset_streams, 20);
    assert_eq!(s.h2_max_local_error_reset_streams, 1024);
    assert!(s.h2_keep_alive_interval.is_zero());
    assert_eq!(s.h2_keep_alive_timeout, Duration::from_secs(20));
    let s = Config::from_toml(&format!(
        "[server]\nmax_header_size = \"32KiB\"\nh2_keep_alive_interval = \"30s\"\n{backend}"
    ))
    .unwrap()
    .server;
    assert_eq!(
        s.h2_max_header_list_size,
        32 << 10,
        "follows max_header_size"
    );
    assert_eq!(s.h2_keep_alive_interval, Duration::from_secs(30));
    let Err(ConfigError::Invalid(issues)) = Config::from_toml(&format!(
        "[server]\nh2_max_concurrent_streams = 0\nh2_max_header_list_size = \"1KiB\"\n\
         h2_max_pending_accept_reset_streams = -1\nh2_max_local_error_reset_streams = 0\n\
         h2_keep_alive_timeout = \"0s\"\n{backend}"
    )) else {
        panic!("accepted")
    };
    let mut paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
    paths.sort_unstable();
    assert_eq!(
        paths,
        [
            "server.h2_keep_alive_timeout",
            "server.h2_max_concurrent_streams",
            "server.h2_max_header_list_size",
            "server.h2_max_local_error_reset_streams",
            "server.h2_max_pending_accept_reset_streams",
        ],
        "{issues:?}"
    );
}

#[test]
fn tcp_notsent_lowat_has_a_default_and_a_bound() {
    let backend = "[backends.o]\naddress = \"http://127.0.0.1:8080\"\n";
    let s = Config::embedded_default().server;
    assert_eq!(s.tcp_notsent_lowat, 128 << 10);
    let s = Config::from_toml(&format!("[server]\ntcp_notsent_lowat = 0\n{backend}"))
        .unwrap()
        .server;
    assert_eq!(s.tcp_notsent_lowat, 0, "zero leaves the kernel's default");
    let Err(ConfigError::Invalid(issues)) = Config::from_toml(&format!(
        "[server]\ntcp_notsent_lowat = \"2GiB\"\n{backend}"
    )) else {
        panic!("accepted")
    };
    assert_eq!(issues[0].path, "server.tcp_notsent_lowat", "{issues:?}");
}

#[test]
fn listen_backlog_has_a_default_and_bounds() {
    let backend = "[backends.default]\naddress = \"http://127.0.0.1:1\"\n";
    assert_eq!(Config::embedded_default().server.listen_backlog, 1024);
    for bad in ["0", "65536", "\"big\""] {
        let err =
            Config::from_toml(&format!("[server]\nlisten_backlog = {bad}\n{backend}")).unwrap_err();
        let ConfigError::Invalid(issues) = err else {
            panic!("{bad}: {err:?}");
        };
        assert_eq!(issues[0].path, "server.listen_backlog", "{bad}: {issues:?}");
    }
}

#[test]
fn tarpit_max_has_a_default_and_a_bound() {
    let backend = "[backends.o]\naddress = \"http://127.0.0.1:8080\"\n";
    assert_eq!(Config::embedded_default().server.tarpit_max, 10_000);
    let s = Config::from_toml(&format!("[server]\ntarpit_max = 0\n{backend}"))
        .unwrap()
        .server;
    assert_eq!(s.tarpit_max, 0, "zero: refused connections closed at once");
    let Err(ConfigError::Invalid(issues)) =
        Config::from_toml(&format!("[server]\ntarpit_max = -1\n{backend}"))
    else {
        panic!("accepted")
    };
    assert_eq!(issues[0].path, "server.tarpit_max", "{issues:?}");
}

#[test]
fn proxy_protocol_peers_parse_and_need_proxy_protocol() {
    let backend = "[backends.o]\naddress = \"http://127.0.0.1:8080\"\n";
    let c = Config::from_toml(&format!(
        "[server]\nproxy_protocol = true\nproxy_protocol_from = [\"10.0.0.0/8\", \"::1\"]\n{backend}"
    ))
    .unwrap();
    assert!(c.server.proxy_protocol);
    assert!(c.server.proxy_protocol_from[0].contains("10.1.2.3".parse().unwrap()));
    assert!(!Config::embedded_default().server.proxy_protocol);
    let Err(ConfigError::Invalid(issues)) = Config::from_toml(&format!(
        "[server]\nproxy_protocol = \"yes\"\nproxy_protocol_from = [\"10.0.0.0/33\"]\n{backend}"
    )) else {
        panic!("accepted")
    };
    let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(
        paths,
        ["server.proxy_protocol", "server.proxy_protocol_from[0]"],
        "{issues:?}"
    );
    let Err(ConfigError::Invalid(issues)) = Config::from_toml(&format!(
        "[server]\nproxy_protocol_from = [\"10.0.0.0/8\"]\n{backend}"
    )) else {
        panic!("accepted")
    };
    assert_eq!(issues[0].path, "server.proxy_protocol_from");
}

/// With the PROXY protocol on, the peers that may send a header must be
/// listed: by default anyone could claim 127.0.0.1 and pass `purge_allow`.
#[test]
fn proxy_protocol_without_the_peers_allowed_to_send_it_is_refused() {
    let backend = "[backends.o]\naddress = \"http://127.0.0.1:8080\"\n";
    for from in ["", "proxy_protocol_from = []\n"] {
        let Err(ConfigError::Invalid(issues)) =
            Config::from_toml(&format!("[server]\nproxy_protocol = true\n{from}{backend}"))
        else {
            panic!("accepted with {from:?}")
        };
        assert_eq!(issues.len(), 1, "{issues:?}");
        assert_eq!(issues[0].path, "server.proxy_protocol_from");
        assert!(issues[0].message.contains("any client"), "{issues:?}");
    }
    // Trusting every peer is possible, but only when said.
    let c = Config::from_toml(&format!(
        "[server]\nproxy_protocol = true\nproxy_protocol_from = [\"0.0.0.0/0\", \"::/0\"]\n{backend}"
    ))
    .unwrap();
    assert!(c.server.proxy_protocol_from[1].contains("2001:db8::1".parse().unwrap()));
}

#[test]
fn the_tls_quick_flags_make_one_default_certificate() {
    let mut c = Config::embedded_default();
    let mut o = Overrides {
        listen: vec!["https://127.0.0.1:0".into()],
        ..Default::default()
    };
    let Err(ConfigError::Invalid(issues)) = c.apply_overrides(&o) else {
        panic!("https without a certificate")
    };
    assert_eq!(issues[0].path, "-a");
    o.tls_cert = Some("c.pem".into());
    let Err(ConfigError::Invalid(issues)) = c.apply_overrides(&o) else {
        panic!("a certificate without a key")
    };
    assert_eq!(issues[0].path, "--tls-cert");
    o.tls_key = Some("k.pem".into());
    c.apply_overrides(&o).unwrap();
    assert!(c.server.listen.is_empty());
    assert_eq!(c.server.listen_tls, vec!["127.0.0.1:0".parse().unwrap()]);
    assert_eq!(c.server.tls[0].cert, PathBuf::from("c.pem"));
    assert!(c.server.tls[0].names.is_empty());
}

#[test]
fn sizes_and_networks_parse() {
    assert_eq!(parse_size("64KiB").unwrap(), 65536);
    assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
    assert_eq!(parse_size("12").unwrap(), 12);
    assert!(parse_size("12 parsecs").is_err());
    let n = IpNet::parse("10.0.0.0/8").unwrap();
    assert!(n.contains("10.2.3.4".parse().unwrap()));
    assert!(!n.contains("11.0.0.1".parse().unwrap()));
    assert!(
        IpNet::parse("127.0.0.1")
            .unwrap()
            .contains("::ffff:127.0.0.1".parse().unwrap())
    );
    assert!(IpNet::parse("1.2.3.4/33").is_err());
}

#[test]
fn cache_codings_and_stripped_fields_parse_and_bad_ones_are_named() {
    let base = "[backends.default]\naddress = \"http://127.0.0.1:1\"\n";
    let c = Config::from_toml(base).unwrap();
    assert_eq!(c.cache.accept_encoding, ["br", "gzip"]);
    assert_eq!(
        c.cache.strip_request_headers.len(),
        STRIP_REQUEST_HEADERS.len()
    );
    let c = Config::from_toml(&format!(
        "{base}[cache]\naccept_encoding = [\"ZSTD\", \"gzip\"]\nstrip_request_headers = []\n"
    ))
    .unwrap();
    assert_eq!(c.cache.accept_encoding, ["zstd", "gzip"]);
    assert!(c.cache.strip_request_headers.is_empty());
    let err = Config::from_toml(&format!(
        "{base}[cache]\naccept_encoding = [\"gzip\", \"identity\", \"GZIP\", \"a b\"]\nstrip_request_headers = [\"x-ok\", \"bad name\", \"Host\"]\n"
    ))
    .unwrap_err();
    let text = err.to_string();
    for want in [
        "cache.accept_encoding[1]",
        "cache.accept_encoding[2]",
        "cache.accept_encoding[3]",
        "cache.strip_request_headers[1]",
        "cache.strip_request_headers[2]",
    ] {
        assert!(text.contains(want), "missing {want} in {text}");
    }
    assert!(!text.contains("accept_encoding[0]"), "{text}");
    assert!(!text.contains("strip_request_headers[0]"), "{text}");
}

fn admin_issues(admin: &str) -> Vec<ConfigIssue> {
    let text = format!("[backends.default]\naddress = \"http://127.0.0.1:8080\"\n[admin]\n{admin}");
    match Config::from_toml(&text) {
        Ok(_) => Vec::new(),
        Err(ConfigError::Invalid(issues)) => issues,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn a_non_loopback_admin_listener_needs_a_token_file() {
    let issues = admin_issues("listen = \"0.0.0.0:6082\"");
    assert_eq!(issues.len(), 1, "{issues:#?}");
    assert_eq!(issues[0].path, "admin.listen");
    assert!(issues[0].message.contains("token_file"), "{issues:#?}");
    assert!(admin_issues("listen = \"[::]:6082\"")[0].path == "admin.listen");
    // Loopback without a token, and anything with one, are fine.
    assert!(admin_issues("listen = \"127.0.0.1:6082\"").is_empty());
    assert!(admin_issues("listen = \"[::1]:6082\"").is_empty());
    let c = Config::from_toml(
        "[backends.default]\naddress = \"http://127.0.0.1:8080\"\n[admin]\nlisten = \":6082\"\ntoken_file = \"/etc/inlay/admin.token\"",
    )
    .unwrap();
    assert_eq!(c.admin, Some("0.0.0.0:6082".parse().unwrap()));
    assert_eq!(
        c.admin_token_file.as_deref(),
        Some(Path::new("/etc/inlay/admin.token"))
    );
    assert_eq!(
        admin_issues("token_file = \"\"")[0].path,
        "admin.token_file"
    );
    assert_eq!(admin_issues("tokenfile = \"x\"")[0].path, "admin.tokenfile");
}

#[test]
fn admin_origins_and_hosts_parse_and_bad_ones_are_named() {
    let c = Config::from_toml(
        "[backends.default]\naddress = \"http://127.0.0.1:8080\"\n[admin]\nallowed_origins = [\"HTTPS://Ops.Example:443\", \"http://127.0.0.1:8080/\"]\nallowed_hosts = [\"Admin.Internal\"]",
    )
    .unwrap();
    let access = &c.admin_access;
    assert_eq!(
        access.allowed_origins,
        ["https://ops.example", "http://127.0.0.1:8080"]
    );
    assert_eq!(access.allowed_hosts, ["admin.internal"]);
    assert!(access.admits_origin(b"https://ops.example"));
    assert!(!access.admits_origin(b"http://ops.example"));
    assert!(!access.admits_origin(b"null"));
    for host in [
        "admin.internal",
        "ADMIN.internal:6082",
        "localhost:1",
        "localhost.",
        "10.0.0.1:6082",
        "[::1]:6082",
    ] {
        assert!(access.admits_host(host), "{host}");
    }
    for host in [
        "attacker.example",
        "admin.internal.attacker.example",
        "u@localhost",
        "localhost/x",
        "evil.localhost",
    ] {
        assert!(!access.admits_host(host), "{host}");
    }
    // Nothing configured: no origin, and only addresses and localhost.
    let none = Config::embedded_default().admin_access;
    assert!(!none.admits_origin(b"http://127.0.0.1:6082"));
    assert!(none.admits_host("127.0.0.1:6082") && !none.admits_host("admin.internal"));
    let issues = admin_issues(
        "allowed_origins = [\"ftp://a\", \"https://a/path\", \"https://u@a\", \"null\", \"*\"]\nallowed_hosts = [\"a:80\", \"a/b\", \"\", \"[::1]\"]",
    );
    let paths: Vec<_> = issues.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "admin.allowed_origins[0]",
            "admin.allowed_origins[1]",
            "admin.allowed_origins[2]",
            "admin.allowed_origins[3]",
            "admin.allowed_origins[4]",
            "admin.allowed_hosts[0]",
            "admin.allowed_hosts[1]",
            "admin.allowed_hosts[2]",
            "admin.allowed_hosts[3]",
        ],
        "{issues:#?}"
    );
}

#[test]
fn the_admin_flag_is_refused_on_a_public_address_without_a_token_file() {
    let mut c = Config::embedded_default();
    let mut o = Overrides {
        admin: Some(":6082".into()),
        ..Overrides::default()
    };
    let Err(ConfigError::Invalid(issues)) = c.apply_overrides(&o) else {
        panic!("accepted a public admin address without a token")
    };
    assert_eq!(issues[0].path, "--admin");
    assert_eq!(c.admin, None);
    o.admin = Some("127.0.0.1:0".into());
    c.apply_overrides(&o).unwrap();
    assert_eq!(c.admin, Some("127.0.0.1:0".parse().unwrap()));
    c.admin_token_file = Some("t".into());
    o.admin = Some(":6082".into());
    c.apply_overrides(&o).unwrap();
}

/// Every key CONFIG.md documents is one its section reads: with a value of
/// the wrong type each gets a type error, never "unknown setting" (the
/// known keys are derived from the reads, so a key read only in some
/// cases would be refused in the others).
#[test]
fn every_documented_key_is_known_to_its_section() {
    let doc = include_str!("../CONFIG.md");
    let mut keys = Vec::new();
    for line in doc.lines().filter(|l| l.starts_with("| `")) {
        let cell = line.split('|').nth(1).unwrap_or_default();
        keys.extend(
            cell.split(',')
                .map(|k| k.trim().trim_matches('`').to_owned())
                .filter(|k| !k.is_empty()),
        );
    }
    assert!(keys.len() > 90, "CONFIG.md's table was not found: {keys:?}");
    for key in keys {
        let key = key.replace("NAME", "x");
        let (prefix, setting) = match key.split_once("[N].") {
            // An array of tables: `[[server.tls]]` with the key in its entry.
            Some((table, k)) => (format!("[[{table}]]\n"), format!("{k} = {{}}\n")),
            None => (String::new(), format!("{key} = {{}}\n")),
        };
        let toml =
            format!("{setting}{prefix}[backends.default]\naddress = \"http://127.0.0.1:1\"\n");
        let toml = if key.starts_with("server.tls[") {
            format!("[backends.default]\naddress = \"http://127.0.0.1:1\"\n{prefix}{setting}")
        } else {
            toml
        };
        let issues = match Config::from_toml(&toml) {
            Ok(_) => Vec::new(),
            Err(ConfigError::Invalid(issues)) => issues,
            Err(e) => panic!("{key}: {e}"),
        };
        let unknown: Vec<_> = issues
            .iter()
            .filter(|i| i.message.starts_with("unknown setting"))
            .collect();
        assert!(unknown.is_empty(), "{key}: {unknown:#?}\n{toml}");
    }
}

#[test]
fn websocket_defaults_and_bounds() {
    let base = "[backends.default]\naddress = \"http://127.0.0.1:1\"\n";
    let c = Config::from_toml(base).unwrap();
    assert_eq!(c.websocket, WebSocketConfig::default());
    assert!(c.websocket.enabled);
    assert_eq!(c.websocket.tunnelled("WebSocket"), Some("websocket".into()));
    assert_eq!(c.websocket.tunnelled("h2c"), None);
    let c = Config::from_toml(&format!(
        "{base}[websocket]\nidle_timeout = \"30s\"\nmax_tunnels = 5\nother_protocols = [\"My-Proto/2\"]\n"
    ))
    .unwrap();
    assert_eq!(c.websocket.idle_timeout, Duration::from_secs(30));
    assert_eq!(c.websocket.max_tunnels, 5);
    assert_eq!(
        c.websocket.tunnelled("foo, my-proto/2"),
        Some("my-proto/2".into())
    );
    assert_eq!(c.websocket.tunnelled("my-proto"), None);
    let off = Config::from_toml(&format!("{base}[websocket]\nenabled = false\n")).unwrap();
    assert_eq!(off.websocket.tunnelled("websocket"), None);
    let e = Config::from_toml(&format!(
        "{base}[websocket]\nidle_timeout = \"0s\"\nmax_tunnels = 0\nother_protocols = [\"h2c\", \"websocket\", \"a b\", \"ok\"]\n"
    ))
    .unwrap_err()
    .to_string();
    for key in [
        "websocket.idle_timeout",
        "websocket.max_tunnels",
        "websocket.other_protocols[0]",
        "websocket.other_protocols[1]",
        "websocket.other_protocols[2]",
    ] {
        assert!(e.contains(key), "{key}: {e}");
    }
    assert!(!e.contains("other_protocols[3]"), "{e}");
}

#[test]
fn compression_is_on_by_default_and_bad_types_and_levels_are_named() {
    let backend = "[backends.default]\naddress = \"http://127.0.0.1:8080\"\n";
    let c = Config::from_toml(backend).unwrap();
    let rules = c.cache_rules().compression.expect("on by default");
    assert_eq!(rules.min_size, 1024);
    assert_eq!((rules.store_levels.br, rules.store_levels.gzip), (9, 6));
    assert_eq!(rules.stream_levels.br, 4);
    assert_eq!(rules.types.len(), inlay_cache::coding::DEFAULT_TYPES.len());
    assert_eq!(c.compression.max_streams, 1024);
    // `[cache]` alone says nothing of compression.
    assert!(c.cache.rules().compression.is_none());
    let off = Config::from_toml(&format!("{backend}[compression]\nenabled = false")).unwrap();
    assert!(off.cache_rules().compression.is_none());
    let set = Config::from_toml(&format!(
        "{backend}[compression]\ntypes = [\"text/html\", \"+json\"]\nmin_size = \"4KiB\"\nbr_level = 11"
    ))
    .unwrap();
    let rules = set.cache_rules().compression.unwrap();
    assert_eq!(rules.types.len(), 2);
    assert_eq!((rules.min_size, rules.store_levels.br), (4096, 11));
    let err = Config::from_toml(&format!(
        "{backend}[compression]\ntypes = [\"text/html\", \"html\", \"TEXT/HTML\"]\nbr_level = 12\ngzip_level = 0\nmax_streams = -1"
    ))
    .unwrap_err();
    let ConfigError::Invalid(issues) = err else {
        panic!("expected Invalid, got {err:?}")
    };
    let mut paths: Vec<_> = issues.iter().map(|i| i.path.as_str()).collect();
    paths.sort_unstable();
    assert_eq!(
        paths,
        [
            "compression.br_level",
            "compression.gzip_level",
            "compression.max_streams",
            "compression.types[1]",
            "compression.types[2]",
        ],
        "{issues:#?}"
    );
}

#!/usr/bin/env bash
# The Debian package as an operator gets it: build it with cargo deb from the
# metadata in host/inlay/Cargo.toml, unpack it, and check what dpkg would
# install: the binary runs (`inlay --help`, `inlay check` on the packaged
# config), the config is a conffile, the unit carries its hardening and
# passes `systemd-analyze verify`, the maintainer scripts enable the unit, the
# man pages and docs are there.
#
# `make test` runs it after `cargo test`, from the debug binary that run
# already built (a release build with LTO would cost ~10 min of CI); `make
# package` builds the same layout from the release build. About 10 s.
# Usage: package-test.sh [PROFILE_DIR]   (default target/debug)
set -euo pipefail
cd "$(dirname "$0")/../.."
profile_dir="${1:-target/debug}"
case "$profile_dir" in
  target/debug) profile=dev ;;
  target/*) profile="${profile_dir#target/}" ;;
  *) echo "package-test: PROFILE_DIR must be under target/: $profile_dir" >&2; exit 2 ;;
esac

fail() { echo "package-test: FAIL: $*" >&2; exit 1; }

bash loadtests/scripts/ensure-deps.sh package
bin="$profile_dir/inlay"
[ -x "$bin" ] || fail "$bin is not built (cargo build -p inlay first)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The man pages from this binary, gzipped (cargo deb compresses nothing of target/).
rm -rf "$profile_dir/man" && mkdir -p "$profile_dir/man"
"$bin" manpages "$profile_dir/man"
gzip -9n "$profile_dir/man"/*.1

# --profile dev is what cargo-deb calls unsupported (a warning in the pinned
# version): the test wants the package's layout, not a release binary.
# --fast: light compression, seconds instead of a minute for a debug binary.
cargo deb -p inlay --no-build --locked --fast --profile "$profile" -o "$work/" \
  2> "$work/cargo-deb.log" || { cat "$work/cargo-deb.log" >&2; fail "cargo deb"; }
debs=("$work"/inlay_*_amd64.deb)
[ -f "${debs[0]}" ] && [ "${#debs[@]}" = 1 ] || fail "no single inlay_<version>_amd64.deb in $work: $(ls "$work")"
deb="${debs[0]}"
echo "package-test: built $(basename "$deb") ($(du -h "$deb" | cut -f1))"

root="$work/root"
dpkg-deb -x "$deb" "$root"
dpkg-deb -e "$deb" "$work/control"

# Control: the package depends on what the binary links (computed, $auto).
grep -q '^Package: inlay$' "$work/control/control" || fail "control: Package"
grep -q '^Depends: .*libc6' "$work/control/control" || fail "control: Depends lacks libc6: $(cat "$work/control/control")"
# The config survives upgrades as the operator edited it.
grep -qx '/etc/inlay/inlay.toml' "$work/control/conffiles" || fail "/etc/inlay/inlay.toml is not a conffile"
# Install enables and starts the unit; removal stops it; purge removes the cache.
grep -q 'deb-systemd-helper enable inlay.service' "$work/control/postinst" || fail "postinst does not enable inlay.service"
grep -q 'deb-systemd-invoke $_dh_action inlay.service' "$work/control/postinst" || fail "postinst does not start inlay.service"
grep -q 'deb-systemd-invoke stop inlay.service' "$work/control/prerm" || fail "prerm does not stop inlay.service"
grep -q 'rm -rf /var/lib/private/inlay' "$work/control/postrm" || fail "postrm does not purge the cache"
for s in postinst prerm postrm; do sh -n "$work/control/$s" || fail "$s is not valid sh"; done

for f in usr/bin/inlay etc/inlay/inlay.toml usr/lib/systemd/system/inlay.service \
  usr/share/man/man1/inlay.1.gz usr/share/man/man1/inlay-serve.1.gz usr/share/man/man1/inlay-check.1.gz \
  usr/share/doc/inlay/README.md usr/share/doc/inlay/CONFIG.md usr/share/doc/inlay/copyright; do
  [ -s "$root/$f" ] || fail "missing from the package: /$f"
done
# Every page of docs/ beside the README, where its links point.
for page in docs/*.md; do
  [ -s "$root/usr/share/doc/inlay/$page" ] || fail "missing from the package: /usr/share/doc/inlay/$page"
done

# The packaged binary on the packaged config.
"$root/usr/bin/inlay" --help | grep -q 'serve' || fail "inlay --help"
"$root/usr/bin/inlay" check --config "$root/etc/inlay/inlay.toml" || fail "inlay check rejects the packaged config"
# The config the unit serves with: the cache in the unit's StateDirectory.
grep -qx 'dir = "/var/lib/inlay/cache"' "$root/etc/inlay/inlay.toml" || fail "cache.dir is not in the StateDirectory"
gzip -dc "$root/usr/share/man/man1/inlay.1.gz" | grep -q '^\.TH inlay 1' || fail "inlay.1 is not a man page"

# The unit's hardening, directive by directive.
unit="$root/usr/lib/systemd/system/inlay.service"
for d in 'Type=simple' 'ExecStart=/usr/bin/inlay serve --config /etc/inlay/inlay.toml' \
  'ExecReload=/bin/kill -HUP $MAINPID' 'Restart=on-failure' 'DynamicUser=yes' \
  'ProtectSystem=strict' 'ProtectHome=yes' 'PrivateTmp=yes' 'NoNewPrivileges=yes' \
  'StateDirectory=inlay' 'CapabilityBoundingSet=CAP_NET_BIND_SERVICE' \
  'AmbientCapabilities=CAP_NET_BIND_SERVICE' 'LimitNOFILE=65536' \
  'SystemCallFilter=@system-service'; do
  grep -qxF "$d" "$unit" || fail "inlay.service lacks $d"
done
# wasmtime maps the code it compiles executable: W^X denial breaks every policy.
! grep -q '^MemoryDenyWriteExecute=yes' "$unit" || fail "MemoryDenyWriteExecute=yes would stop policies from loading"

if command -v systemd-analyze >/dev/null 2>&1; then
  # verify checks that ExecStart exists: point it at the unpacked binary,
  # and the man: link at the unpacked pages. It exits 0 on unknown keys or
  # bad values, so any message is a failure.
  mkdir -p "$work/verify"
  sed "s|/usr/bin/inlay|$root/usr/bin/inlay|g" "$unit" > "$work/verify/inlay.service"
  if ! out="$(MANPATH="$root/usr/share/man" systemd-analyze verify "$work/verify/inlay.service" 2>&1)" || [ -n "$out" ]; then
    fail "systemd-analyze verify inlay.service: $out"
  fi
  echo "package-test: systemd-analyze verify: clean"
else
  echo "package-test: SKIP systemd-analyze verify (systemd-analyze not installed)"
fi
echo "package-test: ok"

;; Inlay's WASI preview 1 adapter, for Go policies.
;;
;; Go's `GOOS=wasip1` runtime imports WASI preview 1 (`wasi_snapshot_preview1`).
;; wit-component replaces such imports with an adapter module: the stock one
;; (wasmtime's `wasi-preview1-component-adapter`, reactor flavour) implements
;; them on WASI 0.2, so the component would import `wasi:cli`, `wasi:io`,
;; `wasi:clocks`, `wasi:random` and `wasi:filesystem`, which the host gives no
;; policy. This adapter takes its place (`inlay-componentize encode` adds it
;; when a core module imports `wasi_snapshot_preview1`) and implements the
;; whole preview 1 surface on the `inlay:policy` world alone:
;;
;;   stdout, stderr     each line of each write a log line (`log.write`):
;;                      stdout at info, stderr (Go's fatal errors) at error;
;;                      bytes that are not UTF-8 end the line there. There is
;;                      no memory of its own to keep a partial line in, so a
;;                      line written in pieces (Go's runtime prints that way)
;;                      is logged in pieces; the Go SDK logs a hook's panic
;;                      itself, as one line
;;   wall clock         `clock.now-unix-ms`
;;   monotonic clock    virtual: it never calls the host (the runtime reads it
;;                      all the time, and a call to the clock ends a recorded
;;                      path, so replay would never answer a Go policy); it
;;                      moves one nanosecond per read, to the wall clock when
;;                      the policy reads that (so `time.Since` measures wall
;;                      time between reads of `time.Now`), and to a timer's
;;                      deadline when the runtime waits for one (`time.Sleep`
;;                      returns at once, its duration passed in virtual time)
;;   random_get         fails (ENOSYS): policies get no randomness; the Go
;;                      runtime seeds its maps from the clocks instead, and
;;                      crypto/rand fails loudly
;;   args, environment  empty
;;   stdin              at its end
;;   proc_exit          traps (the host fails the request alone)
;;   everything else    files, sockets, signals: EBADF or ENOSYS
;;
;; It keeps its state (the virtual clock) in globals and allocates nothing,
;; so it needs neither `cabi_realloc` nor memory of its own: the main
;; module's memory is where Go's buffers already are.
(module
  (import "env" "memory" (memory 0))
  (import "inlay:policy/log@0.1.0" "write" (func $log_write (param i32 i32 i32)))
  (import "inlay:policy/clock@0.1.0" "now-unix-ms" (func $now_unix_ms (result i64)))

  ;; The virtual monotonic clock, in nanoseconds.
  (global $mono (mut i64) (i64.const 0))

  ;; --- the clocks -------------------------------------------------------

  ;; The next reading of the virtual monotonic clock.
  (func $mono_next (result i64)
    (global.set $mono (i64.add (global.get $mono) (i64.const 1)))
    (global.get $mono))

  ;; Moves the monotonic clock forward to `t` (never back).
  (func $mono_reach (param $t i64)
    (if (i64.gt_u (local.get $t) (global.get $mono))
      (then (global.set $mono (local.get $t)))))

  (func (export "clock_time_get") (param $id i32) (param $precision i64) (param $out i32) (result i32)
    (local $t i64)
    (block $bad
      (block $monotonic
        (block $realtime
          (br_table $realtime $monotonic $bad (local.get $id)))
        ;; realtime: milliseconds from the host.
        (local.set $t (i64.mul (call $now_unix_ms) (i64.const 1000000)))
        (call $mono_reach (local.get $t))
        (i64.store (local.get $out) (local.get $t))
        (return (i32.const 0)))
      ;; monotonic (process and thread CPU time clocks are refused below).
      (i64.store (local.get $out) (call $mono_next))
      (return (i32.const 0)))
    (i32.const 28)) ;; EINVAL

  (func (export "clock_res_get") (param $id i32) (param $out i32) (result i32)
    (if (i32.gt_u (local.get $id) (i32.const 1))
      (then (return (i32.const 28))))
    ;; 1 ms for the wall clock, 1 ns for the virtual one.
    (i64.store (local.get $out)
      (select (i64.const 1000000) (i64.const 1) (i32.eqz (local.get $id))))
    (i32.const 0))

  ;; Called by the Go bindings' `cabi_realloc` around allocations, during
  ;; which a component may not call the host; this clock never does.
  (func (export "adapter_monotonic_clock_set_paused") (param i32))

  ;; Waits for the subscriptions' first event. Clock subscriptions (the
  ;; runtime's timers) fire at once, the monotonic clock moved to their
  ;; deadline; file descriptor subscriptions fail with EBADF.
  (func (export "poll_oneoff") (param $in i32) (param $out i32) (param $n i32) (param $nevents i32) (result i32)
    (local $i i32) (local $sub i32) (local $ev i32) (local $events i32)
    (local $deadline i64) (local $best i64) (local $best_sub i32)
    (if (i32.eqz (local.get $n)) (then (return (i32.const 28))))
    (local.set $best (i64.const -1))
    (local.set $best_sub (i32.const -1))
    ;; Every fd subscription gets an EBADF event; remember the earliest clock.
    (loop $each
      (local.set $sub (i32.add (local.get $in) (i32.mul (local.get $i) (i32.const 48))))
      (if (i32.eqz (i32.load8_u offset=8 (local.get $sub)))
        (then
          ;; clock: id @16, timeout @24, flags @40 (1 = absolute)
          (local.set $deadline (i64.load offset=24 (local.get $sub)))
          (if (i32.eqz (i32.and (i32.load16_u offset=40 (local.get $sub)) (i32.const 1)))
            (then (local.set $deadline (i64.add (global.get $mono) (local.get $deadline)))))
          (if (i64.lt_u (local.get $deadline) (local.get $best))
            (then
              (local.set $best (local.get $deadline))
              (local.set $best_sub (local.get $sub)))))
        (else
          (local.set $ev (i32.add (local.get $out) (i32.mul (local.get $events) (i32.const 32))))
          (i64.store (local.get $ev) (i64.load (local.get $sub)))
          (i32.store16 offset=8 (local.get $ev) (i32.const 8)) ;; EBADF
          (i32.store8 offset=10 (local.get $ev) (i32.load8_u offset=8 (local.get $sub)))
          (i64.store offset=16 (local.get $ev) (i64.const 0))
          (i32.store16 offset=24 (local.get $ev) (i32.const 0))
          (local.set $events (i32.add (local.get $events) (i32.const 1)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $each (i32.lt_u (local.get $i) (local.get $n))))
    (if (i32.and (i32.eqz (local.get $events)) (i32.ge_s (local.get $best_sub) (i32.const 0)))
      (then
        (call $mono_reach (local.get $best))
        (i64.store (local.get $out) (i64.load (local.get $best_sub)))
        (i32.store16 offset=8 (local.get $out) (i32.const 0))
        (i32.store8 offset=10 (local.get $out) (i32.const 0))
        (local.set $events (i32.const 1))))
    (i32.store (local.get $nevents) (local.get $events))
    (i32.const 0))

  (func (export "sched_yield") (result i32) (i32.const 0))

  ;; --- stdout and stderr: log lines ------------------------------------

  ;; The length of the longest valid UTF-8 prefix of [ptr, ptr+len), as
  ;; Rust's `str::from_utf8` (which the host's string lifting applies) has it.
  (func $utf8_prefix (param $ptr i32) (param $len i32) (result i32)
    (local $i i32) (local $b i32) (local $need i32) (local $lo i32) (local $hi i32) (local $k i32)
    (block $done
      (loop $char
        (br_if $done (i32.ge_u (local.get $i) (local.get $len)))
        (local.set $b (i32.load8_u (i32.add (local.get $ptr) (local.get $i))))
        (local.set $lo (i32.const 0x80))
        (local.set $hi (i32.const 0xBF))
        (block $classified
          (if (i32.lt_u (local.get $b) (i32.const 0x80))
            (then (local.set $need (i32.const 0)) (br $classified)))
          (if (i32.lt_u (local.get $b) (i32.const 0xC2)) (then (br $done)))
          (if (i32.lt_u (local.get $b) (i32.const 0xE0))
            (then (local.set $need (i32.const 1)) (br $classified)))
          (if (i32.lt_u (local.get $b) (i32.const 0xF0))
            (then
              (local.set $need (i32.const 2))
              (if (i32.eq (local.get $b) (i32.const 0xE0)) (then (local.set $lo (i32.const 0xA0))))
              (if (i32.eq (local.get $b) (i32.const 0xED)) (then (local.set $hi (i32.const 0x9F))))
              (br $classified)))
          (if (i32.lt_u (local.get $b) (i32.const 0xF5))
            (then
              (local.set $need (i32.const 3))
              (if (i32.eq (local.get $b) (i32.const 0xF0)) (then (local.set $lo (i32.const 0x90))))
              (if (i32.eq (local.get $b) (i32.const 0xF4)) (then (local.set $hi (i32.const 0x8F))))
              (br $classified)))
          (br $done))
        ;; The continuation bytes must all be there; the first within [lo, hi].
        (br_if $done (i32.gt_u (i32.add (local.get $i) (local.get $need))
                               (i32.sub (local.get $len) (i32.const 1))))
        (local.set $k (i32.const 1))
        (block $checked
          (loop $cont
            (br_if $checked (i32.gt_u (local.get $k) (local.get $need)))
            (local.set $b (i32.load8_u (i32.add (local.get $ptr) (i32.add (local.get $i) (local.get $k)))))
            (br_if $done (i32.lt_u (local.get $b) (local.get $lo)))
            (br_if $done (i32.gt_u (local.get $b) (local.get $hi)))
            (local.set $lo (i32.const 0x80))
            (local.set $hi (i32.const 0xBF))
            (local.set $k (i32.add (local.get $k) (i32.const 1)))
            (br $cont)))
        (local.set $i (i32.add (local.get $i) (i32.add (local.get $need) (i32.const 1))))
        (br $char)))
    (local.get $i))

  ;; One log line of [ptr, ptr+len): its valid UTF-8 prefix, if not empty.
  (func $line (param $level i32) (param $ptr i32) (param $len i32)
    (local.set $len (call $utf8_prefix (local.get $ptr) (local.get $len)))
    (if (local.get $len)
      (then (call $log_write (local.get $level) (local.get $ptr) (local.get $len)))))

  ;; Each line of [ptr, ptr+len) (split at `\n`) as a log line.
  (func $lines (param $level i32) (param $ptr i32) (param $len i32)
    (local $start i32) (local $i i32)
    (local.set $start (local.get $ptr))
    (block $done
      (loop $scan
        (br_if $done (i32.ge_u (local.get $i) (local.get $len)))
        (if (i32.eq (i32.load8_u (i32.add (local.get $ptr) (local.get $i))) (i32.const 10))
          (then
            (call $line (local.get $level) (local.get $start)
              (i32.sub (i32.add (local.get $ptr) (local.get $i)) (local.get $start)))
            (local.set $start (i32.add (i32.add (local.get $ptr) (local.get $i)) (i32.const 1)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $scan)))
    (call $line (local.get $level) (local.get $start)
      (i32.sub (i32.add (local.get $ptr) (local.get $len)) (local.get $start))))

  (func (export "fd_write") (param $fd i32) (param $iovs i32) (param $n i32) (param $written i32) (result i32)
    (local $level i32) (local $i i32) (local $iov i32) (local $total i32)
    (if (i32.eq (local.get $fd) (i32.const 1))
      (then (local.set $level (i32.const 2))) ;; info
      (else
        (if (i32.eq (local.get $fd) (i32.const 2))
          (then (local.set $level (i32.const 4))) ;; error
          (else (return (i32.const 8)))))) ;; EBADF
    (block $done
      (loop $each
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $iov (i32.add (local.get $iovs) (i32.mul (local.get $i) (i32.const 8))))
        (call $lines (local.get $level) (i32.load (local.get $iov)) (i32.load offset=4 (local.get $iov)))
        (local.set $total (i32.add (local.get $total) (i32.load offset=4 (local.get $iov))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $each)))
    (i32.store (local.get $written) (local.get $total))
    (i32.const 0))

  ;; --- the process --------------------------------------------------------

  (func (export "proc_exit") (param i32) unreachable)
  (func (export "proc_raise") (param i32) (result i32) (i32.const 52))
  (func (export "random_get") (param i32 i32) (result i32) (i32.const 52))

  ;; No arguments and no environment.
  (func $no_strings (param $count i32) (param $size i32) (result i32)
    (i32.store (local.get $count) (i32.const 0))
    (i32.store (local.get $size) (i32.const 0))
    (i32.const 0))
  (func (export "args_sizes_get") (param i32 i32) (result i32)
    (call $no_strings (local.get 0) (local.get 1)))
  (func (export "environ_sizes_get") (param i32 i32) (result i32)
    (call $no_strings (local.get 0) (local.get 1)))
  (func (export "args_get") (param i32 i32) (result i32) (i32.const 0))
  (func (export "environ_get") (param i32 i32) (result i32) (i32.const 0))

  ;; --- file descriptors: 0, 1 and 2 only ----------------------------------

  (func $is_stdio (param $fd i32) (result i32) (i32.lt_u (local.get $fd) (i32.const 3)))

  ;; A character device: stdin readable, stdout and stderr writable.
  (func (export "fd_fdstat_get") (param $fd i32) (param $out i32) (result i32)
    (if (i32.eqz (call $is_stdio (local.get $fd))) (then (return (i32.const 8))))
    (i32.store8 (local.get $out) (i32.const 2)) ;; character_device
    (i32.store16 offset=2 (local.get $out) (i32.const 0))
    ;; rights: fd_read (bit 1) for stdin, fd_write (bit 6) for the others
    (i64.store offset=8 (local.get $out)
      (select (i64.const 2) (i64.const 64) (i32.eqz (local.get $fd))))
    (i64.store offset=16 (local.get $out) (i64.const 0))
    (i32.const 0))
  (func (export "fd_fdstat_set_flags") (param $fd i32) (param i32) (result i32)
    (select (i32.const 0) (i32.const 8) (call $is_stdio (local.get $fd))))
  (func (export "fd_close") (param $fd i32) (result i32)
    (select (i32.const 0) (i32.const 8) (call $is_stdio (local.get $fd))))
  ;; stdin is at its end.
  (func (export "fd_read") (param $fd i32) (param i32 i32) (param $read i32) (result i32)
    (if (i32.ne (local.get $fd) (i32.const 0)) (then (return (i32.const 8))))
    (i32.store (local.get $read) (i32.const 0))
    (i32.const 0))
  ;; No preopened directories: the runtime's scan of them stops at fd 3.
  (func (export "fd_prestat_get") (param i32 i32) (result i32) (i32.const 8))
  (func (export "fd_prestat_dir_name") (param i32 i32 i32) (result i32) (i32.const 8))

  ;; Everything else about files and sockets: EBADF (no such descriptor)
  ;; for calls on a descriptor, ENOSYS for the paths (there is no directory
  ;; to resolve them in, but say so plainly).
  (func (export "fd_advise") (param i32 i64 i64 i32) (result i32) (i32.const 8))
  (func (export "fd_allocate") (param i32 i64 i64) (result i32) (i32.const 8))
  (func (export "fd_datasync") (param i32) (result i32) (i32.const 8))
  (func (export "fd_fdstat_set_rights") (param i32 i64 i64) (result i32) (i32.const 8))
  (func (export "fd_filestat_get") (param i32 i32) (result i32) (i32.const 8))
  (func (export "fd_filestat_set_size") (param i32 i64) (result i32) (i32.const 8))
  (func (export "fd_filestat_set_times") (param i32 i64 i64 i32) (result i32) (i32.const 8))
  (func (export "fd_pread") (param i32 i32 i32 i64 i32) (result i32) (i32.const 8))
  (func (export "fd_pwrite") (param i32 i32 i32 i64 i32) (result i32) (i32.const 8))
  (func (export "fd_readdir") (param i32 i32 i32 i64 i32) (result i32) (i32.const 8))
  (func (export "fd_renumber") (param i32 i32) (result i32) (i32.const 8))
  (func (export "fd_seek") (param i32 i64 i32 i32) (result i32) (i32.const 8))
  (func (export "fd_sync") (param i32) (result i32) (i32.const 8))
  (func (export "fd_tell") (param i32 i32) (result i32) (i32.const 8))
  (func (export "path_create_directory") (param i32 i32 i32) (result i32) (i32.const 52))
  (func (export "path_filestat_get") (param i32 i32 i32 i32 i32) (result i32) (i32.const 52))
  (func (export "path_filestat_set_times") (param i32 i32 i32 i32 i64 i64 i32) (result i32) (i32.const 52))
  (func (export "path_link") (param i32 i32 i32 i32 i32 i32 i32) (result i32) (i32.const 52))
  (func (export "path_open") (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32) (i32.const 52))
  (func (export "path_readlink") (param i32 i32 i32 i32 i32 i32) (result i32) (i32.const 52))
  (func (export "path_remove_directory") (param i32 i32 i32) (result i32) (i32.const 52))
  (func (export "path_rename") (param i32 i32 i32 i32 i32 i32) (result i32) (i32.const 52))
  (func (export "path_symlink") (param i32 i32 i32 i32 i32) (result i32) (i32.const 52))
  (func (export "path_unlink_file") (param i32 i32 i32) (result i32) (i32.const 52))
  (func (export "sock_accept") (param i32 i32 i32) (result i32) (i32.const 8))
  (func (export "sock_recv") (param i32 i32 i32 i32 i32 i32) (result i32) (i32.const 8))
  (func (export "sock_send") (param i32 i32 i32 i32 i32) (result i32) (i32.const 8))
  (func (export "sock_shutdown") (param i32 i32) (result i32) (i32.const 8))
)

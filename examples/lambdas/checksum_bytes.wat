;; checksum_bytes: the same 64-bit FNV-1a hash as checksum.wat, written the obvious way
;; (one byte per loop iteration). Kept to compare with checksum.wat: run
;; `lambda_bench --module examples/lambdas/checksum_bytes.wat` (README, "Lambdas").
;;
;; ABI (see services/src/lambda/mod.rs): exports `memory`, `alloc(len) -> ptr` and
;; `run(ptr, len) -> (out_ptr << 32 | out_len)`.
(module
  (memory (export "memory") 1)

  ;; Bump allocator: 8-byte-aligned blocks from $next upwards, never freed (each
  ;; invocation gets a fresh instance). Grows memory as needed; traps if it cannot.
  (global $next (mut i32) (i32.const 1024))
  (func $alloc (export "alloc") (param $len i32) (result i32)
    (local $ptr i32)
    (local $end i32)
    (local $have i32)
    (local.set $ptr (global.get $next))
    (local.set $end (i32.add (local.get $ptr) (local.get $len)))
    (local.set $have (i32.shl (memory.size) (i32.const 16)))
    (if (i32.gt_u (local.get $end) (local.get $have))
      (then
        (if (i32.eq
              (memory.grow
                (i32.shr_u
                  (i32.add (i32.sub (local.get $end) (local.get $have)) (i32.const 0xffff))
                  (i32.const 16)))
              (i32.const -1))
          (then unreachable))))
    (global.set $next (i32.and (i32.add (local.get $end) (i32.const 7)) (i32.const -8)))
    (local.get $ptr))

  (func (export "run") (param $ptr i32) (param $len i32) (result i64)
    (local $hash i64)
    (local $end i32)
    (local $out i32)
    (local.set $hash (i64.const 0xcbf29ce484222325))
    (local.set $end (i32.add (local.get $ptr) (local.get $len)))
    (block $done
      (loop $byte
        (br_if $done (i32.ge_u (local.get $ptr) (local.get $end)))
        (local.set $hash
          (i64.mul
            (i64.xor (local.get $hash) (i64.load8_u (local.get $ptr)))
            (i64.const 0x100000001b3)))
        (local.set $ptr (i32.add (local.get $ptr) (i32.const 1)))
        (br $byte)))
    (local.set $out (call $alloc (i32.const 8)))
    (i64.store (local.get $out) (local.get $hash))
    (i64.or
      (i64.shl (i64.extend_i32_u (local.get $out)) (i64.const 32))
      (i64.const 8)))
)

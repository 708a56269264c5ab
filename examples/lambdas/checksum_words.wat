;; checksum_words: the 64-bit FNV-1a hash of the input, returned as 8 little-endian bytes,
;; 32 bytes per loop iteration from four 64-bit loads (the previous `checksum.wat`, kept
;; for comparison: `lambda_bench --module`).
;; The same bytes as `rdmactor_services::lambda::checksum_native`.
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

  ;; The input is read 32 bytes per loop iteration, as four 64-bit loads whose bytes are
  ;; then hashed one by one in order (little-endian: byte k of a word is bits 8k..8k+7),
  ;; then byte by byte for the last len % 32. Same algorithm and result as a plain
  ;; byte-at-a-time loop (FNV-1a is a serial chain, nothing to vectorize), but a fraction
  ;; of its loads, bounds checks, loop branches and fuel/epoch checks: under the test
  ;; VM's emulated CPU (qemu TCG) each of those costs far more than the multiply chain
  ;; itself, and the byte loop ran 8 to 10 times slower than native Rust there (see
  ;; README, "Lambdas"). The prime lives in a local computed from `len` (the added term
  ;; is always 0) so that Cranelift keeps it in a register instead of reading it from
  ;; its constant pool at every multiply.
  (func (export "run") (param $ptr i32) (param $len i32) (result i64)
    (local $hash i64)
    (local $prime i64)
    (local $word i64)
    (local $end i32)
    (local $blocks_end i32)
    (local $out i32)
    (local.set $hash (i64.const 0xcbf29ce484222325))
    (local.set $prime
      (i64.or (i64.const 0x100000001b3)
              (i64.shr_u (i64.extend_i32_u (local.get $len)) (i64.const 63))))
    (local.set $end (i32.add (local.get $ptr) (local.get $len)))
    (local.set $blocks_end
      (i32.add (local.get $ptr) (i32.and (local.get $len) (i32.const -32))))
    (block $blocks_done
      (loop $block
        (br_if $blocks_done (i32.ge_u (local.get $ptr) (local.get $blocks_end)))
        (local.set $word (i64.load offset=0 (local.get $ptr)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (local.get $word) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 8)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 16)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 24)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 32)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 40)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 48)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 56)) (i64.const 0xff))) (local.get $prime)))
        (local.set $word (i64.load offset=8 (local.get $ptr)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (local.get $word) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 8)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 16)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 24)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 32)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 40)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 48)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 56)) (i64.const 0xff))) (local.get $prime)))
        (local.set $word (i64.load offset=16 (local.get $ptr)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (local.get $word) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 8)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 16)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 24)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 32)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 40)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 48)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 56)) (i64.const 0xff))) (local.get $prime)))
        (local.set $word (i64.load offset=24 (local.get $ptr)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (local.get $word) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 8)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 16)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 24)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 32)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 40)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 48)) (i64.const 0xff))) (local.get $prime)))
        (local.set $hash (i64.mul (i64.xor (local.get $hash) (i64.and (i64.shr_u (local.get $word) (i64.const 56)) (i64.const 0xff))) (local.get $prime)))
        (local.set $ptr (i32.add (local.get $ptr) (i32.const 32)))
        (br $block)))
    (block $done
      (loop $byte
        (br_if $done (i32.ge_u (local.get $ptr) (local.get $end)))
        (local.set $hash
          (i64.mul
            (i64.xor (local.get $hash) (i64.load8_u (local.get $ptr)))
            (local.get $prime)))
        (local.set $ptr (i32.add (local.get $ptr) (i32.const 1)))
        (br $byte)))
    (local.set $out (call $alloc (i32.const 8)))
    (i64.store (local.get $out) (local.get $hash))
    (i64.or
      (i64.shl (i64.extend_i32_u (local.get $out)) (i64.const 32))
      (i64.const 8)))
)

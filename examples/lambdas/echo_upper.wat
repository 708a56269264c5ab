;; echo_upper: returns the input with ASCII a-z turned into A-Z; other bytes unchanged.
(module
  (memory (export "memory") 1)

  ;; Bump allocator, as in checksum.wat.
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
    (local $out i32)
    (local $i i32)
    (local $b i32)
    (local.set $out (call $alloc (local.get $len)))
    (block $done
      (loop $byte
        (br_if $done (i32.ge_u (local.get $i) (local.get $len)))
        (local.set $b (i32.load8_u (i32.add (local.get $ptr) (local.get $i))))
        ;; b - 'a' < 26 (unsigned) <=> 'a' <= b <= 'z'
        (if (i32.lt_u (i32.sub (local.get $b) (i32.const 97)) (i32.const 26))
          (then (local.set $b (i32.sub (local.get $b) (i32.const 32)))))
        (i32.store8 (i32.add (local.get $out) (local.get $i)) (local.get $b))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $byte)))
    (i64.or
      (i64.shl (i64.extend_i32_u (local.get $out)) (i64.const 32))
      (i64.extend_i32_u (local.get $len))))
)

;; infinite_loop: `run` never returns. The sandbox stops it with OutOfFuel or Timeout,
;; whichever limit comes first.
(module
  (memory (export "memory") 1)
  ;; Inputs up to 64 KiB land at address 0.
  (func (export "alloc") (param $len i32) (result i32)
    (i32.const 0))
  (func (export "run") (param $ptr i32) (param $len i32) (result i64)
    (loop $forever
      (br $forever))
    (i64.const 0))
)

;; trap: `run` executes `unreachable`. The sandbox returns Trap.
(module
  (memory (export "memory") 1)
  ;; Inputs up to 64 KiB land at address 0.
  (func (export "alloc") (param $len i32) (result i32)
    (i32.const 0))
  (func (export "run") (param $ptr i32) (param $len i32) (result i64)
    unreachable)
)

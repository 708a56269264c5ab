;; memory_bomb: `run` grows memory by 1 MiB at a time, forever. The sandbox stops it with
;; MemoryLimit at the first growth past Limits::max_memory_bytes.
(module
  (memory (export "memory") 1)
  ;; Inputs up to 64 KiB land at address 0.
  (func (export "alloc") (param $len i32) (result i32)
    (i32.const 0))
  (func (export "run") (param $ptr i32) (param $len i32) (result i64)
    (loop $more
      (drop (memory.grow (i32.const 16)))
      (br $more))
    (i64.const 0))
)

//! Registered memory shared by every connection of a device: a pool of registered arenas
//! carved into size classes, handed out as leases that return on drop.

mod pool;

pub use pool::{
    Charge, ChunkSource, HeapCharge, Lease, MrPool, Pool, PoolConfig, PoolError, PoolStats,
    RegisteredChunks, RoomWaiter,
};

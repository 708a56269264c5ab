//! Registered memory shared by every connection of a device: a pool of registered arenas
//! carved into size classes, handed out as leases that return on drop.

mod line;
mod pool;

pub use line::{Ask, Line, RoomWaker};

pub use pool::{
    Charge, ChunkSource, HeapCharge, Lease, MrPool, PlaceInLine, Pool, PoolConfig, PoolError,
    PoolStats, RegisterError, RegisteredChunks,
};

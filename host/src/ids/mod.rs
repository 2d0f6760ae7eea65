//! Identifiers the owner node hands out: snowflake message ids and per-conversation seqs.
//!
//! Both are allocated on the hot path of every send, so both answer from memory: the
//! snowflake generator from a clock reading and a counter, the seq allocator from a segment
//! leased ahead of need.

pub mod seq;
pub mod snowflake;

pub use crate::config::SeqConfig;
pub use crate::store::{Fence, LeaseError, OwnerClaim, SeqRange};
pub use seq::{Allocated, SeqAllocator};
pub use snowflake::{SnowflakeGenerator, decompose};

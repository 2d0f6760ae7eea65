//! Identifiers the owner node hands out: snowflake message ids and per-conversation seqs.
//!
//! Both are allocated on the hot path of every send, so both answer from memory: the
//! snowflake generator from a clock reading and a counter, the seq allocator from a segment
//! leased ahead of need. Neither goes back across a restart: seqs come from leases above
//! every earlier one, and the generator [resumes](resume()) above its node id's newest
//! committed id.

pub mod resume;
pub mod seq;
pub mod snowflake;

pub use crate::config::SeqConfig;
pub use crate::store::{Fence, IdMarks, LeaseError, OwnerClaim, SeqRange};
pub use resume::{ClockBehind, ResumeError, resume};
pub use seq::{Allocated, SeqAllocator};
pub use snowflake::{SnowflakeGenerator, decompose};

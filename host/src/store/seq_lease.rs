//! Segment leases for the seq allocator, from the `session_seq` table, fenced by owner.
//!
//! One transaction moves the conversation's `max_seq` up by the step; the range between the
//! old and new value belongs to the caller alone. Because `max_seq` only ever grows and is
//! committed before any seq of the range is used, a crash can waste seqs but never reissue one.
//!
//! # The owner fence
//!
//! In cluster mode one node owns a conversation, as the ring at some epoch says; but a node
//! paused past its cluster lease, or one that has not yet seen a ring change, may still
//! believe it owns a conversation another node has taken over. So every lease carries an
//! [`OwnerClaim`] (this node, the epoch of the ring that made it the owner), and the row
//! records who leased last (`owner_node`, `owner_epoch`). In the same atomic step as the
//! lease ([`OwnerClaim::against`] is the rule):
//!
//! - a claim by the node already recorded, or with a newer epoch than the recorded one, or
//!   on a conversation with no row yet, leases; the recorded owner becomes the claimant,
//!   keeping the recorded epoch when it was already the claimant (so a node that re-leases
//!   after a ring change that left it the owner keeps the fence its messages in flight
//!   carry);
//! - any other claim leases nothing: [`LeaseError::Superseded`].
//!
//! The lease hands back the row's resulting [`Fence`]. Messages carry it to the commit, which
//! checks it against the row under a shared lock and refuses a message whose fence is no
//! longer the row's (see `messages.rs`). That shared lock makes a new owner's lease wait for
//! a commit of the old owner already under way, so whatever the old owner stores lands below
//! the new owner's first seq, and nothing of the old owner's lands after it.

use async_trait::async_trait;

use super::{Database, StoreError, on_backend, signed, unsigned};
use crate::model::{ConversationId, NodeId};

/// An inclusive range of seqs reserved for one allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqRange {
    /// The first seq of the range.
    pub first: u64,
    /// The last seq of the range (inclusive).
    pub last: u64,
}

/// Who asks for a lease: a node that believes it owns the conversation, and the epoch of the
/// ring that says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerClaim {
    /// The node asking.
    pub node: NodeId,
    /// The epoch of the ring view that made `node` the owner.
    pub epoch: u64,
}

/// The owner a lease was taken under, as the `session_seq` row records it: a message's seq
/// may be committed only while the row still names this owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fence {
    /// The owning node.
    pub node: NodeId,
    /// The epoch it has owned the conversation since (its first lease after taking over).
    pub epoch: u64,
}

impl OwnerClaim {
    /// The rule of a lease: the fence the row holds after a lease by this claim on a row
    /// recorded as `current` (`None`: no row yet), or `Err(current)` when the claim is
    /// refused because another node took the conversation over at the same or a newer epoch.
    ///
    /// # Errors
    /// The row's owner, when it is another node with an epoch not older than the claim's.
    pub fn against(self, current: Option<Fence>) -> Result<Fence, Fence> {
        match current {
            None => Ok(Fence { node: self.node, epoch: self.epoch }),
            Some(owner) if owner.node == self.node => Ok(owner),
            Some(owner) if owner.epoch < self.epoch => Ok(Fence { node: self.node, epoch: self.epoch }),
            Some(owner) => Err(owner),
        }
    }
}

/// A leased range and the owner it was leased under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The seqs reserved.
    pub range: SeqRange,
    /// What a message using one of them must carry to be committed.
    pub fence: Fence,
}

/// A lease could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Another node owns the conversation now (it leased at the same or a newer ring epoch):
    /// this node must stop acting as its owner until its ring says otherwise.
    #[error(
        "{conversation} was taken over by node {node} at ring epoch {epoch}: this node no longer owns it; retry \
         once the ring names the owner"
    )]
    Superseded {
        /// The conversation whose segment was wanted.
        conversation: ConversationId,
        /// The node the row names as owner.
        node: NodeId,
        /// The epoch it owns the conversation since.
        epoch: u64,
    },
    /// The database could not be reached or the transaction failed; nothing was leased.
    #[error("could not lease seqs for {conversation}: {reason}")]
    Database {
        /// The conversation whose segment was wanted.
        conversation: ConversationId,
        /// What the database said.
        reason: String,
    },
}

/// Where the seq allocator's segments come from: the `session_seq` table of whichever
/// backend is configured, shared by every node.
#[async_trait]
pub trait SeqLeases: Send + Sync + 'static {
    /// Atomically moves `conversation`'s high-water mark up by `step`, if `claim` may lease
    /// it (see [`OwnerClaim::against`]), and returns the range in between, which no other
    /// caller, on any node, can ever be given, with the fence its messages must carry.
    ///
    /// # Errors
    /// [`LeaseError::Superseded`] when another node owns the conversation at the same or a
    /// newer epoch; [`LeaseError::Database`] when the database cannot be reached or the
    /// transaction fails. Either way nothing was leased.
    async fn lease(&self, conversation: &ConversationId, step: u64, claim: OwnerClaim) -> Result<Lease, LeaseError>;
}

/// How a dialect takes a lease.
#[derive(Debug)]
pub enum LeaseSql {
    /// One conditional upsert (binds: conversation, step, node, epoch) that returns
    /// `max_seq, owner_node, owner_epoch` when the claim leased and no row when it was
    /// refused; then `owner` (binds: conversation) reads who holds the row.
    Returning { upsert: &'static str, owner: &'static str },
    /// A transaction: `lock` reads `max_seq, owner_node, owner_epoch` with the row's
    /// exclusive lock (binds: conversation); the rule is applied here, and `update` (binds:
    /// max_seq, node, epoch, conversation) writes the outcome. A conversation with no row
    /// gets one from `create` (binds: conversation, node, epoch; a no-op when a row exists)
    /// outside the transaction first, so two nodes creating it never deadlock on the gap
    /// locks a locking read of a missing row takes.
    Locking { lock: &'static str, update: &'static str, create: &'static str },
}

/// What the lease statements leave the row as.
enum Leased {
    Took { max_seq: u64, fence: Fence },
    Refused(Fence),
}

#[async_trait]
impl SeqLeases for Database {
    async fn lease(&self, conversation: &ConversationId, step: u64, claim: OwnerClaim) -> Result<Lease, LeaseError> {
        let database =
            |error: StoreError| LeaseError::Database { conversation: conversation.clone(), reason: error.to_string() };
        match self.lease_range(conversation, step, claim).await.map_err(database)? {
            Leased::Took { max_seq, fence } => {
                Ok(Lease { range: SeqRange { first: max_seq + 1 - step, last: max_seq }, fence })
            }
            Leased::Refused(owner) => {
                Err(LeaseError::Superseded { conversation: conversation.clone(), node: owner.node, epoch: owner.epoch })
            }
        }
    }
}

/// A `session_seq` row's owner as stored.
pub(super) fn fence_of(node: i64, epoch: i64) -> Result<Fence, StoreError> {
    let node = u32::try_from(node).map_err(|_| StoreError::Corrupt(format!("session_seq.owner_node {node}")))?;
    Ok(Fence { node: NodeId(node), epoch: unsigned(epoch, "session_seq.owner_epoch")? })
}

impl Database {
    /// The highest owner epoch any `session_seq` row names (0 when there is none).
    ///
    /// Ring epochs are counted in Redis. A cluster whose Redis lost its data while none of
    /// its nodes ran (a full restart) would count from zero again, and a conversation owned
    /// at an epoch above the new count could then be leased by no node until the count
    /// caught up: a node joining counts from here at least (`cluster/membership`). One scan
    /// of `session_seq` at start.
    ///
    /// # Errors
    /// [`StoreError`] when the database cannot be read.
    pub async fn highest_owner_epoch(&self) -> Result<u64, StoreError> {
        const HIGHEST: &str = "SELECT COALESCE(MAX(owner_epoch), 0) FROM session_seq";
        let highest: i64 = on_backend!(self.reader, |pool, _sql| sqlx::query_scalar(HIGHEST).fetch_one(pool).await?);
        unsigned(highest, "session_seq.owner_epoch")
    }

    /// The lease itself, in the store's own error type.
    async fn lease_range(
        &self,
        conversation: &ConversationId,
        step: u64,
        claim: OwnerClaim,
    ) -> Result<Leased, StoreError> {
        let (node, epoch) = (i64::from(claim.node.0), signed(claim.epoch));
        on_backend!(self.writer, |pool, sql| {
            match sql.lease {
                LeaseSql::Returning { upsert, owner } => {
                    let leased: Option<(i64, i64, i64)> = sqlx::query_as(upsert)
                        .bind(conversation.as_str())
                        .bind(signed(step))
                        .bind(node)
                        .bind(epoch)
                        .fetch_optional(pool)
                        .await?;
                    if let Some((max_seq, node, epoch)) = leased {
                        return Ok(Leased::Took {
                            max_seq: unsigned(max_seq, "max_seq")?,
                            fence: fence_of(node, epoch)?,
                        });
                    }
                    // Refused: say who holds it (it may have moved on again since; this is
                    // for the message only).
                    let (node, epoch): (i64, i64) =
                        sqlx::query_as(owner).bind(conversation.as_str()).fetch_one(pool).await?;
                    Ok(Leased::Refused(fence_of(node, epoch)?))
                }
                LeaseSql::Locking { lock, update, create } => {
                    // At most twice: the second time the row exists.
                    let mut created = false;
                    loop {
                        let mut transaction = pool.begin().await?;
                        let row: Option<(i64, i64, i64)> =
                            sqlx::query_as(lock).bind(conversation.as_str()).fetch_optional(&mut *transaction).await?;
                        let Some((max_seq, owner_node, owner_epoch)) = row else {
                            transaction.rollback().await?;
                            if created {
                                return Err(StoreError::Corrupt(format!(
                                    "the session_seq row of {conversation} vanished while leasing"
                                )));
                            }
                            sqlx::query(create)
                                .bind(conversation.as_str())
                                .bind(node)
                                .bind(epoch)
                                .execute(pool)
                                .await?;
                            created = true;
                            continue;
                        };
                        let current = fence_of(owner_node, owner_epoch)?;
                        let Ok(fence) = claim.against(Some(current)) else {
                            transaction.rollback().await?;
                            return Ok(Leased::Refused(current));
                        };
                        let max_seq = unsigned(max_seq, "max_seq")? + step;
                        sqlx::query(update)
                            .bind(signed(max_seq))
                            .bind(i64::from(fence.node.0))
                            .bind(signed(fence.epoch))
                            .bind(conversation.as_str())
                            .execute(&mut *transaction)
                            .await?;
                        transaction.commit().await?;
                        return Ok(Leased::Took { max_seq, fence });
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: NodeId = NodeId(1);
    const B: NodeId = NodeId(2);

    fn fence(node: NodeId, epoch: u64) -> Fence {
        Fence { node, epoch }
    }

    #[test]
    fn a_first_claim_leases_and_is_recorded_as_the_owner() {
        assert_eq!(OwnerClaim { node: A, epoch: 3 }.against(None), Ok(fence(A, 3)));
    }

    #[test]
    fn the_recorded_owner_keeps_its_fence_whatever_epoch_it_claims_at() {
        for epoch in [1, 5, 9] {
            assert_eq!(OwnerClaim { node: A, epoch }.against(Some(fence(A, 5))), Ok(fence(A, 5)));
        }
    }

    #[test]
    fn another_node_takes_over_only_at_a_newer_epoch() {
        assert_eq!(OwnerClaim { node: B, epoch: 6 }.against(Some(fence(A, 5))), Ok(fence(B, 6)));
        assert_eq!(OwnerClaim { node: B, epoch: 5 }.against(Some(fence(A, 5))), Err(fence(A, 5)));
        assert_eq!(OwnerClaim { node: B, epoch: 4 }.against(Some(fence(A, 5))), Err(fence(A, 5)));
    }

    #[test]
    fn a_superseded_lease_names_the_owner_and_says_what_to_do() {
        let conversation = ConversationId::parse("dm:a:b").expect("valid");
        let error = LeaseError::Superseded { conversation, node: B, epoch: 7 }.to_string();
        assert!(error.starts_with("dm:a:b was taken over by node 2 at ring epoch 7"), "{error}");
        assert!(error.contains("retry"), "{error}");
    }
}

//! Backfill on connect: what a just-connected device's cursors lack, pushed oldest first.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use herald_proto::v1;
use tokio::time::Instant;

use super::session::{Session, read_from};
use super::{Delivery, wire_message};
use crate::model::{ConversationId, ConversationKind, DeviceId, UserId};
use crate::store::StoreError;

/// Rounds of reading every conversation, when more were offered during one round than a
/// session notes, before the session goes live regardless.
const OVERFLOWED_ROUNDS: u32 = 4;

/// Rounds of catching up on conversations offered something during the round before, after
/// which a conversation goes live regardless. Each round reads only conversations offered
/// something new, so one that reaches this bound gets a message in every storage read; it
/// is a guard against a loop without end, never reached at rates storage keeps up with.
const HELD_ROUNDS: u32 = 1000;

impl Delivery {
    /// Every conversation a device should follow, with its server-side cursor: its user's
    /// direct conversations and current groups (a group left keeps its cursor row, and is
    /// not followed).
    pub(super) async fn device_conversations(
        &self,
        user: &UserId,
        device: &DeviceId,
    ) -> Result<BTreeMap<ConversationId, u64>, StoreError> {
        let mut all: BTreeSet<ConversationId> =
            self.stores.conversations.user_conversations(user).await?.into_iter().collect();
        all.extend(self.stores.groups.groups_of(user).await?.iter().map(ConversationId::group));
        let mut out: BTreeMap<ConversationId, u64> = all.into_iter().map(|conversation| (conversation, 0)).collect();
        for (conversation, seq) in self.stores.cursors.cursors(user, device).await? {
            let follows = match conversation.kind() {
                // A cursor outlives a removal from the group: only a member's counts.
                ConversationKind::Group(_) => out.contains_key(&conversation),
                ConversationKind::Direct(..) => true,
                ConversationKind::Room(_) => false,
            };
            if follows {
                out.insert(conversation, seq);
            }
        }
        // Acks not written yet count too, also where storage has no cursor row at all.
        for (conversation, seq) in &mut out {
            if let Some(pending) = self.cursors.pending(user, device, conversation) {
                *seq = (*seq).max(pending);
            }
        }
        Ok(out)
    }

    /// Pushes to a just-connected device what its cursors lack, oldest first, waiting for
    /// room in its queue (so a reconnect storm paces itself), then lets live pushes through
    /// and catches up on what was stored meanwhile.
    ///
    /// A device back within the reconnect grace period (its session resumed from the
    /// dropped one) is owed only a few conversations, known without asking the database:
    /// only those are read. Otherwise every conversation of the user is.
    ///
    /// `unfinished` counts the connection as not backfilled yet until this returns.
    pub async fn backfill(self: &Arc<Self>, session: Arc<Session>, unfinished: Unfinished) {
        let _unfinished = unfinished;
        // Called once the device's login is in the route table: from now on every message
        // stored reaches this session by fan-out, so a read of what changed that began now
        // or later misses nothing, however long this backfill waits for its permit. The
        // devices of a reconnect storm queued on the permits share one such read.
        let logged_in = Instant::now();
        if !self.vitals.tier().backfills() {
            // Degraded: the device catches up by sync instead.
            session.skip_backfill();
            return;
        }
        let Ok(permit) = self.backfill_permits.acquire().await else { return };
        let resumed = session.take_resume();
        let path = if resumed.is_none() { "full" } else { "resumed" };
        let full = resumed.is_none();
        let mut timed = Timed::permitted(path, logged_in);
        metrics::counter!("herald_delivery_backfills_total", "path" => path).increment(1);
        // A ledger restored after a restart knows what its device lacked when it was saved;
        // what changed while the node was down, storage says.
        let since = session.since().filter(|_| !full);
        let mut positions = resumed.unwrap_or_default();
        // When storage cannot say what changed, every conversation is read.
        let full = match since {
            Some(since) => !self.add_changed(&session, since, logged_in, &mut positions).await,
            None => full,
        };
        if full {
            match self.device_conversations(&session.user, &session.device).await {
                Ok(conversations) => {
                    for (conversation, cursor) in conversations {
                        positions.entry(conversation).and_modify(|p| *p = (*p).min(cursor)).or_insert(cursor);
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "backfill: storage unavailable; the device can sync");
                    self.vitals.count_error();
                    session.skip_backfill();
                    return;
                }
            }
        }
        if !self.push_after(&session, &mut positions).await {
            return;
        }
        // What remains reads little: the next device in a reconnect storm need not wait for
        // it. Its reads still queue for the database's connections like any other.
        drop(permit);
        timed.checking();
        // Look once more for anything stored before and never offered (a fan-out that read
        // the routes from a cache before the login reached it): after a full backfill, in
        // every conversation, since one may have started meanwhile; after a restored one,
        // where storage says something changed past what was read. Still not live, so that
        // nothing offered meanwhile is pushed ahead of an older message this look finds.
        let unread = match since {
            Some(since) if !full => self.unread_changes(&session, since, Instant::now(), &positions).await,
            _ => None,
        };
        let read_all = full || (since.is_some() && unread.is_none());
        let open = match unread {
            Some(mut unread) => {
                let open = self.push_after(&session, &mut unread).await;
                positions.extend(unread);
                open
            }
            None => {
                if read_all {
                    self.add_every_conversation(&session, &mut positions).await;
                }
                self.push_after(&session, &mut positions).await
            }
        };
        if open && self.go_live_in_order(&session, positions, read_all).await {
            session.clear_since();
            session.end_claims();
        }
    }

    /// Lets live pushes through: first in every conversation offered nothing while backfill
    /// read, then in the others once what they were offered is pushed from storage. A live
    /// push must not overtake an older message still to come from storage, so a conversation
    /// offered something is held, read again, and looked at again, until a look finds nothing
    /// new offered for it. False when the session closed meanwhile.
    async fn go_live_in_order(
        self: &Arc<Self>,
        session: &Arc<Session>,
        mut positions: BTreeMap<ConversationId, u64>,
        mut read_all: bool,
    ) -> bool {
        let mut overflowed = 0;
        for _ in 0..HELD_ROUNDS {
            match session.go_live_except_owed() {
                Some(owed) if owed.is_empty() => return true,
                Some(owed) => {
                    let mut catching_up = BTreeMap::new();
                    for (conversation, lowest) in owed {
                        if let Some(&position) = positions.get(&conversation) {
                            catching_up.insert(conversation.clone(), position);
                        }
                        read_from(&mut catching_up, conversation, lowest);
                    }
                    let open = self.push_after(session, &mut catching_up).await;
                    positions.extend(catching_up);
                    if !open {
                        return false;
                    }
                }
                // Too many conversations offered to note: read every one, still not live.
                None if overflowed < OVERFLOWED_ROUNDS => {
                    overflowed += 1;
                    if !read_all {
                        read_all = self.add_every_conversation(session, &mut positions).await;
                    }
                    if !self.push_after(session, &mut positions).await {
                        return false;
                    }
                }
                None => break,
            }
        }
        // A guard was reached: live in every conversation regardless, and what is still owed
        // (every conversation, when too much to note) is read after.
        match session.go_live() {
            Some(owed) => owed.into_iter().for_each(|(conversation, lowest)| {
                read_from(&mut positions, conversation, lowest);
            }),
            None if !read_all => _ = self.add_every_conversation(session, &mut positions).await,
            None => {}
        }
        self.push_after(session, &mut positions).await
    }

    /// Adds every conversation the device follows that `positions` lacks, from its cursor;
    /// false when storage could not say which they are.
    async fn add_every_conversation(&self, session: &Session, positions: &mut BTreeMap<ConversationId, u64>) -> bool {
        match self.device_conversations(&session.user, &session.device).await {
            Ok(conversations) => {
                for (conversation, cursor) in conversations {
                    positions.entry(conversation).or_insert(cursor);
                }
                true
            }
            Err(error) => {
                tracing::warn!(%error, "backfill: cannot read which conversations the device follows");
                false
            }
        }
    }

    /// One pass: pushes what follows each position (moving it on), skipping what the device
    /// sent or was pushed live already. False when the session closed meanwhile.
    async fn push_after(
        self: &Arc<Self>,
        session: &Arc<Session>,
        positions: &mut BTreeMap<ConversationId, u64>,
    ) -> bool {
        for (conversation, position) in positions.iter_mut() {
            if session.is_closed() {
                return false; // gone (or closed by a shutdown): nothing more to push or read
            }
            let messages =
                match self.stores.messages.messages_after(conversation, *position, self.config.backfill_limit).await {
                    Ok(messages) => messages,
                    Err(error) => {
                        tracing::warn!(%error, %conversation, "backfill: read failed; the device can sync");
                        self.vitals.count_error();
                        continue;
                    }
                };
            for message in messages {
                *position = message.seq;
                if message.is_from(&session.user, &session.device) || !session.claim_push(conversation, message.seq) {
                    continue; // the device has it, or it was pushed live already
                }
                if !self.visible_to(&session.user, &message).await {
                    continue; // the deliver-filter keeps it from this user
                }
                let wire = wire_message(&message);
                let frame = v1::Frame::new(0, v1::Deliver { message: Some(wire.clone()), attempt: 1 });
                if !session.push_waiting(frame).await {
                    return false;
                }
                self.vitals.count_push(1);
                session.note_push(conversation, message.seq, None);
                self.schedule_retry(Arc::clone(session), conversation.clone(), wire, 1);
            }
        }
        true
    }
}

/// Times the parts of one backfill in `herald_delivery_backfill_seconds{path,part}`:
/// `waiting` for a permit from the login on, `reading` what the device lacked (the first
/// pass, with the permit), and `checking`: the last look for what fan-out never offered,
/// and catching up on what it offered meanwhile, until live in every conversation.
struct Timed {
    path: &'static str,
    /// When the current part began.
    since: Instant,
    part: &'static str,
}

impl Timed {
    /// A permit was had now: the wait since `logged_in` is recorded, the reading begins.
    fn permitted(path: &'static str, logged_in: Instant) -> Self {
        let mut timed = Self { path, since: logged_in, part: "waiting" };
        timed.next("reading");
        timed
    }

    /// The first pass is over: the reading is recorded, the last look and catching up until
    /// live begin.
    fn checking(&mut self) {
        self.next("checking");
    }

    fn next(&mut self, part: &'static str) {
        let now = Instant::now();
        metrics::histogram!("herald_delivery_backfill_seconds", "path" => self.path, "part" => self.part)
            .record(now.duration_since(self.since).as_secs_f64());
        (self.since, self.part) = (now, part);
    }
}

impl Drop for Timed {
    /// However the backfill ends; a session that closed midway records its part so far.
    fn drop(&mut self) {
        self.next("");
    }
}

/// Counts one connection in `herald_delivery_backfills_unfinished` for as long as it is
/// held: taken before the connection's `connected` is sent and dropped when its backfill
/// ends, however it ends. A reconnect storm shows there, and so does the moment a device's
/// backfill is over (a connection that drops before then is not resumed from): once its
/// client has seen `connected`, a zero means it is.
pub struct Unfinished(());

impl Unfinished {
    pub fn count() -> Self {
        metrics::gauge!("herald_delivery_backfills_unfinished").increment(1.0);
        Self(())
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        metrics::gauge!("herald_delivery_backfills_unfinished").decrement(1.0);
    }
}

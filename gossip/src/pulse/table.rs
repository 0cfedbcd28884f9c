//! What one node knows of every other node's pulse, and who is live (pure: time is
//! passed in).
//!
//! The table lists the nodes chitchat holds signed state for. Each has a pulse count,
//! learned from pulses, and the time of the last evidence that it lives: its count
//! went up, or, until its pulse is heard, chitchat brought news of it (its heartbeat or
//! its state's version rose), or it has just appeared. A node is live while its last evidence is younger than
//! `dead_after`. The first count heard of a node only sets where it stands: a count
//! relayed long after its node died says nothing about now.
//!
//! A node can also be found *gone*: its connection to us closed and nothing listens at
//! its address any more (the transport's evidence, [`PulseTable::gone`]). A gone node is
//! dead at once, whatever its count or chitchat says, until a pulse comes straight from
//! its address: its last counts, still relayed by others, are no proof that it lives.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use chitchat::ChitchatId;
use rand::Rng;
use rand::seq::IteratorRandom;
use ring::digest::{SHA256, digest};
use tokio::time::Instant;

use super::wire::{Beats, Kind, Pulse};

/// What chitchat holds of a node that changes only when its node speaks: news in it is
/// evidence of life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mark {
    pub heartbeat: u64,
    pub max_version: u64,
}

#[derive(Debug, Clone)]
struct Node {
    id: ChitchatId,
    key: u32,
    /// `None` until a pulse names it; for this node, its own count.
    beat: Option<u64>,
    evidence: Instant,
    mark: Mark,
    /// Nothing listened at its address after its connection closed.
    gone: bool,
}

impl Node {
    /// Chitchat's news of a node is evidence of life only until its pulse is heard:
    /// after a node died, its last news keeps spreading for a while, and counted as
    /// evidence it would bring the node back for another dead-after time, again and
    /// again. Pulses are the evidence once there are any.
    fn take_mark(&mut self, mark: Mark, now: Instant) {
        if self.mark != mark {
            self.mark = mark;
            if self.beat.is_none() {
                self.evidence = now;
            }
        }
    }
}

/// A node's view of its clique's pulses.
#[derive(Debug)]
pub struct PulseTable {
    me: ChitchatId,
    /// Every node of the table, this one included, in chitchat id order: the order of
    /// beats sent by position.
    nodes: Vec<Node>,
    /// Where this node sits in `nodes`.
    mine: usize,
    /// Identifies the order: peers with the same hash read each other's beats by
    /// position.
    table: u64,
    /// Identifies what this node holds of the clique's state (every node's max
    /// version, this one's included): a peer with another is due an exchange.
    state: u64,
    /// Each key's place in `nodes`; a key two nodes share is `None` and read for
    /// neither.
    by_key: HashMap<u32, Option<usize>>,
}

/// What a received pulse did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Received {
    /// Nodes whose count went up.
    pub advanced: usize,
    /// The sender holds another table: it knows of a node this one does not, or the
    /// other way round. Chitchat's anti-entropy would mend it at its next round; an
    /// exchange now mends it at once.
    pub tables_differ: bool,
    /// The sender holds other versions of some node's state: news one of them has not
    /// had yet (a push that missed it, say). An exchange now mends that too.
    pub states_differ: bool,
    /// The answer to send back, for a push.
    pub reply: Option<Pulse>,
}

/// A node's 32-bit key: the start of a SHA-256 of its id, the same on every node.
pub fn key_of(id: &ChitchatId) -> u32 {
    let hash = digest(&SHA256, &id_bytes(id));
    u32::from_be_bytes(hash.as_ref()[..4].try_into().expect("4 bytes"))
}

fn id_bytes(id: &ChitchatId) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(id.node_id.len() + 40);
    bytes.extend_from_slice(id.node_id.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(&id.generation_id.to_be_bytes());
    bytes.extend_from_slice(id.gossip_advertise_addr.to_string().as_bytes());
    bytes.push(0);
    bytes
}

fn table_hash<'a>(order: impl Iterator<Item = &'a ChitchatId>) -> u64 {
    let mut bytes = Vec::new();
    for id in order {
        bytes.extend_from_slice(&id_bytes(id));
    }
    let hash = digest(&SHA256, &bytes);
    u64::from_be_bytes(hash.as_ref()[..8].try_into().expect("8 bytes"))
}

/// Every node's max version, in table order (the same on every node holding the same
/// state). Not a secret: a cheap identity (SHA-256 because it is at hand), computed
/// once per round.
fn state_hash(nodes: &[Node]) -> u64 {
    let mut bytes = Vec::with_capacity(nodes.len() * 12);
    for node in nodes {
        bytes.extend_from_slice(&node.key.to_be_bytes());
        bytes.extend_from_slice(&node.mark.max_version.to_be_bytes());
    }
    let hash = digest(&SHA256, &bytes);
    u64::from_be_bytes(hash.as_ref()[..8].try_into().expect("8 bytes"))
}

/// The full count a 16-bit beat stands for, given the one held; `None` when it is not
/// newer.
fn newer(held: u64, low: u16) -> Option<u64> {
    let step = low.wrapping_sub(held as u16) as i16;
    (step > 0).then(|| held + step as u64)
}

impl PulseTable {
    pub fn new(me: ChitchatId) -> Self {
        let mut table = Self {
            nodes: Vec::new(),
            mine: 0,
            table: 0,
            state: 0,
            by_key: HashMap::new(),
            me,
        };
        table.rebuild(Vec::new(), Instant::now());
        table
    }

    /// This node's count, one up per round.
    pub fn beat(&mut self) {
        let node = &mut self.nodes[self.mine];
        node.beat = Some(node.beat.unwrap_or(0) + 1);
    }

    fn peers(&self) -> impl Iterator<Item = (usize, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .filter(move |(place, _)| *place != self.mine)
    }

    /// Follows the nodes chitchat holds signed state for, with their marks: a node new
    /// to the table, or whose mark changed, shows life now; a node chitchat forgot
    /// leaves the table. Called every round: when nobody came or went (the usual case)
    /// it only compares.
    pub fn sync(&mut self, known: impl IntoIterator<Item = (ChitchatId, Mark)>, now: Instant) {
        let mut mine = None;
        let mut known: Vec<(ChitchatId, Mark)> = known
            .into_iter()
            .filter(|(id, mark)| {
                let is_me = *id == self.me;
                if is_me {
                    mine = Some(*mark);
                }
                !is_me
            })
            .collect();
        if let Some(mark) = mine {
            self.nodes[self.mine].mark = mark;
        }
        // Chitchat lists its nodes in id order already: this costs one pass.
        known.sort_by(|a, b| a.0.cmp(&b.0));
        let same_nodes = known.len() + 1 == self.nodes.len()
            && self
                .peers()
                .zip(&known)
                .all(|((_, node), (id, _))| node.id == *id);
        if same_nodes {
            let mine = self.mine;
            let peers = self
                .nodes
                .iter_mut()
                .enumerate()
                .filter(|(place, _)| *place != mine);
            for ((_, node), (_, mark)) in peers.zip(known) {
                node.take_mark(mark, now);
            }
        } else {
            self.rebuild(known, now);
        }
        self.state = state_hash(&self.nodes);
    }

    /// A new order: nodes kept keep what the table knew of them; new ones show life now.
    fn rebuild(&mut self, known: Vec<(ChitchatId, Mark)>, now: Instant) {
        let mut before: HashMap<ChitchatId, Node> = self
            .nodes
            .drain(..)
            .map(|node| (node.id.clone(), node))
            .collect();
        let (my_beat, my_mark) = before
            .remove(&self.me)
            .map_or((None, Mark::default()), |node| (node.beat, node.mark));
        let mut nodes: Vec<Node> = known
            .into_iter()
            .map(|(id, mark)| match before.remove(&id) {
                Some(mut node) => {
                    node.take_mark(mark, now);
                    node
                }
                None => Node {
                    key: key_of(&id),
                    id,
                    beat: None,
                    evidence: now,
                    mark,
                    gone: false,
                },
            })
            .collect();
        nodes.push(Node {
            key: key_of(&self.me),
            id: self.me.clone(),
            beat: Some(my_beat.unwrap_or(0)),
            evidence: now,
            mark: my_mark,
            gone: false,
        });
        nodes.sort_by(|a, b| a.id.cmp(&b.id));
        self.mine = nodes
            .iter()
            .position(|node| node.id == self.me)
            .expect("this node is in its table");
        self.table = table_hash(nodes.iter().map(|node| &node.id));
        self.by_key.clear();
        for (place, node) in nodes.iter().enumerate() {
            self.by_key
                .entry(node.key)
                .and_modify(|holder| *holder = None)
                .or_insert(Some(place));
        }
        self.nodes = nodes;
    }

    /// Every count this node has heard, by position.
    pub fn push(&self) -> Pulse {
        self.by_position(Kind::Push, |_, _| true)
    }

    fn by_position(&self, kind: Kind, include: impl Fn(usize, u64) -> bool) -> Pulse {
        let (positions, beats) = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(place, node)| {
                let beat = node.beat?;
                include(place, beat).then_some((place, beat as u16))
            })
            .unzip();
        Pulse {
            kind,
            state: self.state,
            beats: Beats::Positions {
                table: self.table,
                len: self.nodes.len(),
                positions,
                beats,
            },
        }
    }

    fn keyed(&self, kind: Kind, include: impl Fn(usize, u64) -> bool) -> Pulse {
        let beats = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(place, node)| {
                let beat = node.beat?;
                include(place, beat).then_some((node.key, beat as u16))
            })
            .collect();
        Pulse {
            kind,
            state: self.state,
            beats: Beats::Keyed(beats),
        }
    }

    /// Takes in a pulse; a push gets a reply with what this node holds newer than the
    /// push said (by position when both hold the same table, by key otherwise).
    pub fn receive(&mut self, pulse: &Pulse, now: Instant) -> Received {
        let mut said: Vec<Option<u16>> = vec![None; self.nodes.len()];
        let mut same_table = false;
        match &pulse.beats {
            Beats::Positions {
                table,
                len,
                positions,
                beats,
            } => {
                if *table == self.table && *len == self.nodes.len() {
                    same_table = true;
                    for (&place, &beat) in positions.iter().zip(beats) {
                        if let Some(slot) = said.get_mut(place) {
                            *slot = Some(beat);
                        }
                    }
                }
            }
            Beats::Keyed(beats) => {
                for &(key, beat) in beats {
                    if let Some(Some(place)) = self.by_key.get(&key) {
                        said[*place] = Some(beat);
                    }
                }
            }
        }
        let mut advanced = 0;
        for (place, node) in self.nodes.iter_mut().enumerate() {
            let Some(low) = said[place] else { continue };
            if place == self.mine {
                continue;
            }
            match node.beat {
                None => node.beat = Some(u64::from(low)),
                Some(held) => {
                    if let Some(count) = newer(held, low) {
                        node.beat = Some(count);
                        node.evidence = now;
                        advanced += 1;
                    }
                }
            }
        }
        let tables_differ = !same_table;
        let states_differ = pulse.state != self.state;
        let reply = (pulse.kind == Kind::Push).then(|| {
            let behind = |place: usize, mine: u64| match said[place] {
                Some(theirs) => newer(u64::from(theirs), mine as u16).is_some(),
                None => true,
            };
            if same_table {
                self.by_position(Kind::Reply, behind)
            } else {
                self.keyed(Kind::Reply, behind)
            }
        });
        Received {
            advanced,
            tables_differ,
            states_differ,
            reply,
        }
    }

    fn node_is_live(&self, place: usize, now: Instant, dead_after: Duration) -> bool {
        let node = &self.nodes[place];
        place == self.mine
            || (!node.gone && now.saturating_duration_since(node.evidence) <= dead_after)
    }

    /// Nothing listens at `addr` any more, after a connection from it closed: the nodes
    /// at that address are dead now. Whether any node was live and is no longer.
    pub fn gone(&mut self, addr: SocketAddr, now: Instant, dead_after: Duration) -> bool {
        let mut ended = false;
        for place in 0..self.nodes.len() {
            if place == self.mine || self.nodes[place].id.gossip_advertise_addr != addr {
                continue;
            }
            ended |= self.node_is_live(place, now, dead_after);
            self.nodes[place].gone = true;
        }
        ended
    }

    /// A pulse came straight from `from`: the newest node at that address lives, gone
    /// or not. Whether it was gone.
    pub fn heard_directly(&mut self, from: SocketAddr, now: Instant) -> bool {
        let mine = self.mine;
        let newest = self
            .nodes
            .iter_mut()
            .enumerate()
            .filter(|(place, node)| *place != mine && node.id.gossip_advertise_addr == from)
            .map(|(_, node)| node)
            .max_by_key(|node| node.id.generation_id);
        match newest {
            Some(node) if node.gone => {
                node.gone = false;
                node.evidence = now;
                true
            }
            _ => false,
        }
    }

    /// Whether `id` (this node included) is live now.
    pub fn is_live(&self, id: &ChitchatId, now: Instant, dead_after: Duration) -> bool {
        self.nodes
            .binary_search_by(|node| node.id.cmp(id))
            .is_ok_and(|place| self.node_is_live(place, now, dead_after))
    }

    /// The live nodes, this one included.
    pub fn live(&self, now: Instant, dead_after: Duration) -> Vec<ChitchatId> {
        (0..self.nodes.len())
            .filter(|place| self.node_is_live(*place, now, dead_after))
            .map(|place| self.nodes[place].id.clone())
            .collect()
    }

    /// Whom to pulse this round: one live peer at random, and now and then a node
    /// thought dead (as likely as there are dead nodes among those known), so that a
    /// partition heals and a node that was silent is heard again.
    pub fn targets(
        &self,
        now: Instant,
        dead_after: Duration,
        rng: &mut impl Rng,
    ) -> Vec<SocketAddr> {
        let (live, dead): (Vec<_>, Vec<_>) = self
            .peers()
            .partition(|(place, _)| self.node_is_live(*place, now, dead_after));
        let mut targets: Vec<SocketAddr> = live
            .iter()
            .choose(rng)
            .map(|(_, node)| node.id.gossip_advertise_addr)
            .into_iter()
            .collect();
        if !dead.is_empty() {
            let chance = dead.len() as f64 / (live.len() + 1) as f64;
            if rng.random_bool(chance.min(1.0)) {
                targets.extend(
                    dead.iter()
                        .choose(rng)
                        .map(|(_, node)| node.id.gossip_advertise_addr),
                );
            }
        }
        targets
    }

    /// How many nodes the table holds, this one included.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;

    const DEAD_AFTER: Duration = Duration::from_secs(3);

    impl PulseTable {
        fn beat_of(&self, id: &ChitchatId) -> Option<u64> {
            let place = self.nodes.binary_search_by(|n| n.id.cmp(id)).ok()?;
            self.nodes[place].beat
        }
    }

    fn id(name: &str) -> ChitchatId {
        ChitchatId::new(name.to_owned(), 1, SocketAddr::from(([127, 0, 0, 1], 7000)))
    }

    fn mark(heartbeat: u64) -> Mark {
        Mark {
            heartbeat,
            max_version: 1,
        }
    }

    fn rack(names: &[&str], me: &str, now: Instant) -> PulseTable {
        let mut table = PulseTable::new(id(me));
        table.sync(names.iter().map(|n| (id(n), mark(1))), now);
        table
    }

    #[test]
    fn newer_reads_sixteen_bits_against_the_count_held() {
        assert_eq!(newer(10, 11), Some(11));
        assert_eq!(newer(10, 10), None);
        assert_eq!(newer(10, 9), None);
        assert_eq!(newer(65_535, 2), Some(65_538));
        assert_eq!(newer(65_538, 65_535), None);
        assert_eq!(newer(0, 32_767), Some(32_767));
        assert_eq!(newer(0, 32_768), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_that_stops_counting_is_dead_after_the_timeout_and_not_before() {
        let t0 = Instant::now();
        let names = ["a", "b", "c"];
        let mut a = rack(&names, "a", t0);
        let mut b = rack(&names, "b", t0);
        let mut c = rack(&names, "c", t0);
        // b and c pulse a every 200 ms for 10 s; c stops at 5 s.
        let mut now = t0;
        for round in 0..50 {
            now += Duration::from_millis(200);
            b.beat();
            a.receive(&b.push(), now);
            if round < 25 {
                c.beat();
                a.receive(&c.push(), now);
            }
            assert!(a.is_live(&id("b"), now, DEAD_AFTER));
            let c_silent_for = now.saturating_duration_since(t0 + Duration::from_millis(200 * 25));
            assert_eq!(
                a.is_live(&id("c"), now, DEAD_AFTER),
                c_silent_for <= DEAD_AFTER,
                "at {:?}",
                now - t0
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_count_heard_of_a_node_is_no_evidence_that_it_lives() {
        let t0 = Instant::now();
        let mut a = rack(&["a", "b", "c"], "a", t0);
        let mut b = rack(&["a", "b", "c"], "b", t0);
        // b relays a count of c it holds from long ago; c never speaks again.
        let c = b.nodes.iter().position(|n| n.id == id("c")).unwrap();
        b.nodes[c].beat = Some(500);
        let later = t0 + Duration::from_secs(2);
        a.receive(&b.push(), later);
        assert_eq!(a.beat_of(&id("c")), Some(500));
        assert!(!a.is_live(&id("c"), t0 + Duration::from_secs(4), DEAD_AFTER));
    }

    #[tokio::test(start_paused = true)]
    async fn news_in_chitchat_is_evidence_until_the_pulse_is_heard() {
        let t0 = Instant::now();
        let mut a = rack(&["a", "b"], "a", t0);
        let later = t0 + Duration::from_secs(2);
        a.sync([(id("b"), mark(2))], later);
        assert!(a.is_live(&id("b"), later + DEAD_AFTER, DEAD_AFTER));
        // An unchanged mark is not.
        a.sync([(id("b"), mark(2))], later + Duration::from_secs(2));
        assert!(!a.is_live(
            &id("b"),
            later + DEAD_AFTER + Duration::from_millis(1),
            DEAD_AFTER
        ));
        // Once b's pulse is heard, only its pulse is: its news still spreading after it
        // died does not bring it back.
        let mut b = rack(&["a", "b"], "b", t0);
        b.beat();
        a.receive(&b.push(), later);
        let dead = later + DEAD_AFTER * 2;
        a.sync([(id("b"), mark(3))], dead);
        assert!(!a.is_live(&id("b"), dead, DEAD_AFTER));
        b.beat();
        a.receive(&b.push(), dead);
        assert!(a.is_live(&id("b"), dead, DEAD_AFTER));
    }

    #[tokio::test(start_paused = true)]
    async fn a_push_is_answered_with_only_what_the_pusher_lacks() {
        let t0 = Instant::now();
        let names = ["a", "b", "c", "d"];
        let mut a = rack(&names, "a", t0);
        let mut b = rack(&names, "b", t0);
        let mut c = rack(&names, "c", t0);
        let mut d = rack(&names, "d", t0);
        for _ in 0..3 {
            c.beat();
            d.beat();
        }
        b.receive(&c.push(), t0);
        b.receive(&d.push(), t0);
        // a has heard nothing: b tells it of b, c and d, all by position.
        let received = b.receive(&a.push(), t0);
        let Some(reply) = received.reply else {
            panic!("a push is answered")
        };
        let Beats::Positions { positions, .. } = &reply.beats else {
            panic!("same table: by position, got {reply:?}")
        };
        assert_eq!(positions.len(), 3);
        assert_eq!(a.receive(&reply, t0).reply, None, "a reply is not answered");
        // Once a holds what b holds, b has nothing to add but its own new beat.
        b.beat();
        let reply = b.receive(&a.push(), t0).reply.unwrap();
        let Beats::Positions { positions, .. } = &reply.beats else {
            panic!()
        };
        assert_eq!(positions, &vec![1], "only b's own beat");
    }

    #[tokio::test(start_paused = true)]
    async fn peers_whose_tables_differ_speak_by_key() {
        let t0 = Instant::now();
        let mut a = rack(&["a", "b", "c"], "a", t0);
        // b does not know c yet.
        let mut b = rack(&["a", "b"], "b", t0);
        for _ in 0..2 {
            a.beat();
            b.beat();
        }
        let received = b.receive(&a.push(), t0);
        assert!(received.tables_differ);
        let reply = received.reply.unwrap();
        assert!(matches!(reply.beats, Beats::Keyed(_)), "{reply:?}");
        assert!(a.receive(&reply, t0).tables_differ);
        assert_eq!(a.beat_of(&id("b")), Some(2));
        // b could not read a's push by position, so a is not yet counted there...
        assert_eq!(b.beat_of(&id("a")), None);
        // ...until b learns of c and the tables agree.
        b.sync([(id("a"), mark(1)), (id("c"), mark(1))], t0);
        assert_eq!(a.table, b.table);
        assert!(!b.receive(&a.push(), t0).tables_differ);
        assert_eq!(b.beat_of(&id("a")), Some(2));
    }

    #[tokio::test(start_paused = true)]
    async fn peers_holding_other_versions_are_told_apart() {
        let t0 = Instant::now();
        let mut a = rack(&["a", "b", "c"], "a", t0);
        let mut b = rack(&["a", "b", "c"], "b", t0);
        assert!(!b.receive(&a.push(), t0).states_differ);
        // a hears of c's new value; b has not yet.
        let newer = Mark {
            heartbeat: 1,
            max_version: 2,
        };
        a.sync([(id("b"), mark(1)), (id("c"), newer)], t0);
        let received = b.receive(&a.push(), t0);
        assert!(received.states_differ && !received.tables_differ);
        // So does a, from b's reply.
        assert!(a.receive(&received.reply.unwrap(), t0).states_differ);
        b.sync([(id("a"), mark(1)), (id("c"), newer)], t0);
        assert!(!b.receive(&a.push(), t0).states_differ);
    }

    fn at(name: &str, generation: u64, port: u16) -> ChitchatId {
        ChitchatId::new(
            name.to_owned(),
            generation,
            SocketAddr::from(([127, 0, 0, 1], port)),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_gone_node_is_dead_at_once_and_relayed_counts_do_not_revive_it() {
        let t0 = Instant::now();
        let ids = [at("a", 1, 7001), at("b", 1, 7002), at("c", 1, 7003)];
        let table = |me: &ChitchatId| {
            let mut table = PulseTable::new(me.clone());
            table.sync(ids.iter().map(|id| (id.clone(), mark(1))), t0);
            table
        };
        let (mut a, mut b, mut c) = (table(&ids[0]), table(&ids[1]), table(&ids[2]));
        for _ in 0..3 {
            c.beat();
            b.receive(&c.push(), t0);
            a.receive(&c.push(), t0);
        }
        c.beat();
        b.receive(&c.push(), t0);
        let soon = t0 + Duration::from_millis(50);
        assert!(a.gone(ids[2].gossip_advertise_addr, soon, DEAD_AFTER));
        assert!(!a.is_live(&ids[2], soon, DEAD_AFTER));
        assert!(
            a.is_live(&ids[1], soon, DEAD_AFTER),
            "only the node at that address"
        );
        assert!(
            !a.gone(ids[2].gossip_advertise_addr, soon, DEAD_AFTER),
            "told once"
        );
        // b relays c's last count, newer than a's: no proof that c lives.
        assert_eq!(a.receive(&b.push(), soon).advanced, 1);
        assert!(!a.is_live(&ids[2], soon, DEAD_AFTER));
        // Nor is chitchat's news of it.
        a.sync([(ids[1].clone(), mark(1)), (ids[2].clone(), mark(9))], soon);
        assert!(!a.is_live(&ids[2], soon, DEAD_AFTER));
        // A pulse straight from c's address is.
        assert!(
            !a.heard_directly(ids[1].gossip_advertise_addr, soon),
            "b was not gone"
        );
        assert!(a.heard_directly(ids[2].gossip_advertise_addr, soon));
        assert!(a.is_live(&ids[2], soon, DEAD_AFTER));
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_restarted_at_a_gone_address_speaks_for_itself_only() {
        let t0 = Instant::now();
        let old = at("b", 1, 7002);
        let mut a = PulseTable::new(at("a", 1, 7001));
        a.sync([(old.clone(), mark(1))], t0);
        assert!(a.gone(old.gossip_advertise_addr, t0, DEAD_AFTER));
        let new = at("b", 2, 7002);
        a.sync([(old.clone(), mark(1)), (new.clone(), mark(1))], t0);
        assert!(
            a.is_live(&new, t0, DEAD_AFTER),
            "a new node is live as it appears"
        );
        assert!(!a.heard_directly(new.gossip_advertise_addr, t0));
        assert!(
            !a.is_live(&old, t0, DEAD_AFTER),
            "the old generation stays gone"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_forgotten_node_leaves_the_table() {
        let t0 = Instant::now();
        let mut a = rack(&["a", "b", "c"], "a", t0);
        let before = a.table;
        a.sync([(id("b"), mark(1))], t0);
        assert_eq!(a.node_count(), 2);
        assert_ne!(a.table, before);
        assert!(!a.is_live(&id("c"), t0, DEAD_AFTER));
    }

    #[tokio::test(start_paused = true)]
    async fn targets_are_one_live_peer_and_now_and_then_a_dead_one() {
        let t0 = Instant::now();
        let names: Vec<String> = (0..10).map(|i| format!("n{i}")).collect();
        let mut a = PulseTable::new(id("n0"));
        a.sync(
            names.iter().map(|n| {
                let id = ChitchatId::new(n.clone(), 1, SocketAddr::from(([127, 0, 0, 1], 7000)));
                (id, mark(1))
            }),
            t0,
        );
        let mut rng = SmallRng::seed_from_u64(7);
        let now = t0 + Duration::from_secs(1);
        for _ in 0..20 {
            assert_eq!(a.targets(now, DEAD_AFTER, &mut rng).len(), 1);
        }
        // Everyone silent: every round tries one of them.
        let later = t0 + Duration::from_secs(10);
        for _ in 0..20 {
            assert_eq!(a.targets(later, DEAD_AFTER, &mut rng).len(), 1);
        }
        // Alone: nobody to pulse.
        let alone = PulseTable::new(id("solo"));
        assert!(alone.targets(now, DEAD_AFTER, &mut rng).is_empty());
    }
}

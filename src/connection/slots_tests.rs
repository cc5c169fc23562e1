use super::*;

/// Puts handshake `id` of `source`, waiting since `since`, into `pending`: its eviction token.
fn hold(pending: &mut Pending, id: u64, source: IpAddr, since: Instant) -> CancellationToken {
    let token = CancellationToken::new();
    pending.order.push_back((id, since));
    pending.live.insert(id, (source, token.clone()));
    *pending.by_source.entry(source).or_insert(0) += 1;
    pending.total += 1;
    token
}

/// Twenty-seventh adversarial pass, M1: only a source that would still hold as many as the
/// newcomer's gives a slot up: the one holding the most, at once, where it holds more;
/// among equals the oldest, once it has waited `EVICTABLE_AFTER`; never the newcomer's
/// own, never one holding fewer.
#[test]
fn a_slot_goes_from_the_source_holding_the_most() {
    let (a, b, c) = (
        IpAddr::from([192, 0, 2, 1]),
        IpAddr::from([192, 0, 2, 2]),
        IpAddr::from([192, 0, 2, 3]),
    );
    let now = Instant::now();
    let long_ago = now.checked_sub(EVICTABLE_AFTER * 2).unwrap_or(now);
    let mut pending = Pending::default();
    let mut tokens = Vec::new();
    for (id, (source, since)) in [(a, long_ago), (b, long_ago), (b, now), (b, now)]
        .into_iter()
        .enumerate()
    {
        tokens.push(hold(&mut pending, id as u64, source, since));
    }
    // c holds none: b (three) gives up its oldest, at once.
    assert!(pending.evict_for(c, 0, now));
    assert!(tokens[1].is_cancelled() && !tokens[0].is_cancelled());
    assert_eq!((pending.total, pending.by_source[&b]), (3, 2));
    // a holding one: b's two are not more than a's two would be; the oldest of those
    // holding as many (b's, young) is too young, and a's own never goes.
    assert!(!pending.evict_for(a, 1, now));
    // Later, b's have aged: the oldest of them goes.
    let later = now + EVICTABLE_AFTER;
    assert!(pending.evict_for(a, 1, later));
    assert!(tokens[2].is_cancelled() && !tokens[0].is_cancelled());
    // b holding one and a one: a newcomer of b would hold two, more than a: none gives way.
    assert!(!pending.evict_for(b, 1, later));
}

/// Twenty-eighth adversarial pass, F1: among sources holding one slot each, a source whose
/// handshake was just evicted (a stalled socket renewed at once) does not take the next
/// slot that has waited `EVICTABLE_AFTER`; a fresh source does, and the evicted one may
/// again once `STALLED_REMEMBERED` has passed. Where it holds fewer than another source
/// (not equals) it still takes that one's slot at once.
#[test]
fn a_source_just_evicted_does_not_evict_an_equal_in_turn() {
    let sources: Vec<IpAddr> = (1..=5).map(|i| IpAddr::from([192, 0, 2, i])).collect();
    let now = Instant::now();
    let long_ago = now.checked_sub(EVICTABLE_AFTER * 2).unwrap_or(now);
    let mut pending = Pending::default();
    let mut tokens = Vec::new();
    for (id, source) in sources[..3].iter().enumerate() {
        tokens.push(hold(&mut pending, id as u64, *source, long_ago));
    }
    let (a, b, fresh) = (sources[0], sources[1], sources[3]);
    // A newcomer from e (holding none) takes a's slot, the oldest; a is remembered.
    assert!(pending.evict_for(sources[4], 0, now));
    assert!(tokens[0].is_cancelled());
    // a's renewal, holding none now, would hold one like the others: it was evicted lately.
    assert!(!pending.evict_for(a, 0, now));
    // A fresh source's newcomer takes the next old slot (b's).
    assert!(pending.evict_for(fresh, 0, now));
    assert!(tokens[1].is_cancelled() && !tokens[2].is_cancelled());
    // Where a holds fewer than c (three), it takes one of c's at once.
    let c = sources[2];
    for id in [9, 10] {
        hold(&mut pending, id, c, now);
    }
    assert!(pending.evict_for(a, 0, now), "c holds more than a would");
    assert!(tokens[2].is_cancelled());
    // Remembered for STALLED_REMEMBERED only.
    assert!(!pending.stalled.lately(fresh, now));
    assert!(pending.stalled.lately(b, now));
    assert!(!pending.stalled.lately(b, now + STALLED_REMEMBERED));
}

/// The memory of evicted sources keeps at most `STALLED_MOST`, the oldest forgotten first.
#[test]
fn the_evicted_sources_remembered_are_bounded() {
    let now = Instant::now();
    let mut stalled = StalledLately::default();
    for i in 0..=STALLED_MOST as u32 {
        stalled.record(IpAddr::from(i.to_be_bytes()), now, Ended::Evicted);
    }
    assert_eq!(stalled.order.len(), STALLED_MOST);
    assert_eq!(stalled.latest.len(), STALLED_MOST);
    assert!(!stalled.lately(IpAddr::from(0u32.to_be_bytes()), now));
    assert!(stalled.lately(IpAddr::from(1u32.to_be_bytes()), now));
}

fn admission(max_connections: usize, max_pending: usize, per_source: usize) -> Arc<Admission> {
    connected_bounds(
        max_connections,
        0,
        &ServerSlots::new(0),
        max_pending,
        per_source,
    )
}

fn connected_bounds(
    max_connections: usize,
    max_connections_per_source: usize,
    server: &Arc<ServerSlots>,
    max_pending: usize,
    max_pending_per_source: usize,
) -> Arc<Admission> {
    Admission::new(
        "test",
        AdmissionLimits {
            max_connections,
            max_connections_per_source,
            max_pending,
            max_pending_per_source,
            connection_cost: 0,
        },
        server,
        &Metrics::register(),
    )
}

/// Every connected client holds one: 24 bytes with an anonymous client's charge in it.
#[test]
fn a_connected_slot_stays_24_bytes() {
    assert_eq!(size_of::<ConnectedSlot>(), 24);
}

/// What an idle connection of each kind is charged: TLS an order of magnitude above TCP.
#[test]
fn tls_connections_cost_more_than_plain_ones() {
    let cost = |kind| connection_cost(kind);
    assert!(cost(ListenerKind::Tcp) < cost(ListenerKind::Ws));
    assert!(cost(ListenerKind::Ws) * 4 <= cost(ListenerKind::Tls));
    assert!(cost(ListenerKind::Tls) < cost(ListenerKind::Wss));
}

/// A connected slot for a client from `peer`, or the bound that refused it.
fn connect(a: &Arc<Admission>, peer: &str) -> Result<ConnectedSlot, Full> {
    a.arrive(ip(peer))
        .promote(|| false)
        .map_err(|(_, full)| full)
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("literal address")
}

/// A slot that has started waiting for its client.
fn waiting(a: &Arc<Admission>, peer: &str) -> Result<HandshakeSlot, Refused> {
    let mut slot = a.arrive(ip(peer));
    slot.wait_for_client().map(|()| slot)
}

#[test]
fn pending_bounds_overall_and_per_source() {
    let a = admission(0, 3, 2);
    let s1 = waiting(&a, "10.0.0.1").expect("first");
    let s2 = waiting(&a, "10.0.0.1").expect("second from the same source");
    assert_eq!(
        waiting(&a, "10.0.0.1").map(drop),
        Err(Refused::PendingPerSource)
    );
    let s3 = waiting(&a, "10.0.0.2").expect("another source");
    // Full: a source holding none takes a slot of the one holding the most (its oldest).
    let s4 = waiting(&a, "10.0.0.3").expect("10.0.0.1 gives a slot up");
    assert_eq!(a.pending(), 3);
    // Each holds one now, none has waited long: the next is refused.
    assert_eq!(
        waiting(&a, "10.0.0.4").map(drop),
        Err(Refused::PendingLimit)
    );
    drop(s1); // evicted: it gives nothing back
    assert_eq!(a.pending(), 3);
    drop(s2);
    let _s5 = waiting(&a, "10.0.0.1").expect("a slot came back");
    drop((s3, s4));
    assert_eq!(a.pending(), 1);
}

#[test]
fn only_a_handshake_that_waits_takes_a_pending_slot() {
    let a = admission(0, 1, 1);
    // A burst whose CONNECTs were there at once: none of them waits, none is refused.
    let burst: Vec<_> = (0..100).map(|_| a.arrive(ip("10.0.0.1"))).collect();
    assert_eq!(a.pending(), 0);
    let mut waiting = a.arrive(ip("10.0.0.1"));
    waiting.wait_for_client().expect("the one pending slot");
    waiting.wait_for_client().expect("taken once, kept");
    assert_eq!(a.pending(), 1);
    let connected: Vec<_> = burst
        .into_iter()
        .map(|s| s.promote(|| false).expect("no max_connections"))
        .collect();
    assert_eq!((a.pending(), a.connected()), (1, 100));
    drop(waiting);
    assert_eq!(a.pending(), 0);
    drop(connected);
    assert_eq!(a.connected(), 0);
}

#[test]
fn promotion_moves_to_a_connected_slot_apart_from_pending() {
    let a = admission(1, 2, 0);
    let first = waiting(&a, "10.0.0.1").expect("pending");
    let connected = first.promote(|| false).expect("room");
    assert_eq!((a.pending(), a.connected()), (0, 1));
    // The connected client does not take a pending slot: two more handshakes fit.
    let second = waiting(&a, "10.0.0.1").expect("pending");
    let _third = waiting(&a, "10.0.0.1").expect("pending");
    let (second, full) = second
        .promote(|| false)
        .expect_err("max_connections reached");
    assert_eq!(full, Full::Listener);
    assert_eq!(a.pending(), 2, "the refused one keeps its pending slot");
    let taking_over = second.promote(|| true).expect("a takeover is let in");
    assert_eq!((a.pending(), a.connected()), (1, 2));
    drop((connected, taking_over));
    assert_eq!(a.connected(), 0);
}

#[test]
fn connected_per_source_bound_counts_sources_apart_and_frees_on_drop() {
    let server = ServerSlots::new(0);
    let a = connected_bounds(0, 2, &server, 0, 0);
    let first = connect(&a, "10.0.0.1").expect("first");
    let second = connect(&a, "10.0.0.1").expect("second");
    assert_eq!(connect(&a, "10.0.0.1").map(drop), Err(Full::PerSource));
    // The /64 of an IPv6 host is one source; IPv4-mapped is its IPv4 address.
    assert_eq!(
        connect(&a, "::ffff:10.0.0.1").map(drop),
        Err(Full::PerSource)
    );
    let _other = connect(&a, "10.0.0.2").expect("another source");
    assert_eq!(a.connected_from(ip("10.0.0.1")), 2);
    assert_eq!(
        (a.connected(), server.connected()),
        (3, 3),
        "refusals give back"
    );
    drop(first);
    let again = connect(&a, "10.0.0.1").expect("the freed slot is taken again");
    // At the bound a takeover of a connected client id is let in.
    let takeover = a.arrive(ip("10.0.0.1")).promote(|| true).expect("takeover");
    assert_eq!(a.connected_from(ip("10.0.0.1")), 3);
    drop((again, takeover, second));
    assert_eq!(a.connected_from(ip("10.0.0.1")), 0);
    assert!(a.connected_by_source.lock().get(&ip("10.0.0.1")).is_none());
}

#[test]
fn the_server_bound_spans_listeners() {
    let server = ServerSlots::new(2);
    let (one, two) = (
        connected_bounds(0, 1, &server, 0, 0),
        connected_bounds(0, 0, &server, 0, 0),
    );
    let a = connect(&one, "10.0.0.1").expect("first");
    let b = connect(&two, "10.0.0.1").expect("second, other listener");
    assert_eq!(connect(&two, "10.0.0.2").map(drop), Err(Full::Server));
    assert_eq!(connect(&one, "10.0.0.2").map(drop), Err(Full::Server));
    // The refusal on `one` took and gave back its per-source count.
    assert_eq!(one.connected_from(ip("10.0.0.2")), 0);
    assert_eq!((one.connected(), two.connected()), (1, 1));
    let replacing = two
        .arrive(ip("10.0.0.3"))
        .promote(|| true)
        .expect("takeover");
    assert_eq!(server.connected(), 3);
    drop((a, replacing));
    let c = connect(&one, "10.0.0.2").expect("a freed slot is taken again");
    assert_eq!(server.connected(), 2);
    drop((b, c));
    assert_eq!(server.connected(), 0);
}

#[test]
fn a_waiting_slot_moves_to_the_source_a_proxy_header_names() {
    let a = admission(0, 0, 2);
    let mut first = waiting(&a, "10.0.0.1").expect("pending, as the balancer");
    first.set_source(ip("192.0.2.1")).expect("moved");
    assert_eq!(a.pending(), 1);
    let _second = waiting(&a, "10.0.0.1").expect("the balancer's count went down");
    let _third = waiting(&a, "10.0.0.1").expect("and has room for two");
    let _named = waiting(&a, "192.0.2.1").expect("the named source's second");
    let mut fourth = a.arrive(ip("10.0.0.5"));
    fourth.wait_for_client().expect("another balancer address");
    assert_eq!(
        fourth.set_source(ip("192.0.2.1")),
        Err(Refused::PendingPerSource),
        "192.0.2.1 has its two"
    );
    assert_eq!(a.pending(), 5);
    drop(fourth);
    assert_eq!(a.pending(), 4);
    drop(first);
    let _again = waiting(&a, "192.0.2.1").expect("the moved slot came back to 192.0.2.1");
}

#[test]
fn unlimited_admits_everyone() {
    let a = admission(0, 0, 0);
    let slots: Vec<_> = (0..100)
        .map(|_| waiting(&a, "::1").expect("unlimited"))
        .collect();
    assert_eq!(a.pending(), 100);
    let connected: Vec<_> = slots
        .into_iter()
        .map(|s| s.promote(|| false).expect("unlimited"))
        .collect();
    assert_eq!((a.pending(), a.connected()), (0, 100));
    drop(connected);
    assert_eq!(a.connected(), 0);
}

#[test]
fn sources_are_ipv4_addresses_and_ipv6_prefixes() {
    assert_eq!(source_key(ip("192.0.2.7")), ip("192.0.2.7"));
    assert_eq!(source_key(ip("::ffff:192.0.2.7")), ip("192.0.2.7"));
    assert_eq!(
        source_key(ip("2001:db8:1:2:aaaa:bbbb:cccc:dddd")),
        ip("2001:db8:1:2::")
    );
    assert_eq!(
        source_key(ip("2001:db8:1:2::1")),
        source_key(ip("2001:db8:1:2:ffff::9"))
    );
}

/// Twenty-ninth adversarial pass, F1-C: among sources holding one young handshake each, a
/// fresh newcomer takes the slot of a source whose handshake ended unfinished lately (its
/// client closed it, as a stalled socket renewed before it turns evictable does), at any
/// age; the others keep theirs until they have waited `EVICTABLE_AFTER`.
#[test]
fn a_source_that_left_a_handshake_unfinished_gives_way_at_any_age() {
    let sources: Vec<IpAddr> = (1..=5).map(|i| IpAddr::from([192, 0, 2, i])).collect();
    let now = Instant::now();
    let mut pending = Pending::default();
    let tokens: Vec<_> = (0..3)
        .map(|id| hold(&mut pending, id as u64, sources[id], now))
        .collect();
    assert!(
        !pending.evict_for(sources[3], 0, now),
        "all young, none stalled"
    );
    pending.stalled.record(sources[1], now, Ended::Evicted);
    assert!(
        !pending.evict_for(sources[3], 0, now),
        "evicted only: keeps its young ones"
    );
    pending.stalled.record(sources[1], now, Ended::Closed);
    assert!(pending.evict_for(sources[3], 0, now));
    assert!(tokens[1].is_cancelled());
    assert!(!tokens[0].is_cancelled() && !tokens[2].is_cancelled());
    assert!(
        !pending.evict_for(sources[4], 0, now),
        "the others are young"
    );
}

/// A pending slot given back unfinished (the connection closed while it waited) marks its
/// source; one promoted does not.
#[test]
fn a_handshake_closed_while_waiting_marks_its_source() {
    let a = admission(10, 10, 10);
    let mut closed = a.arrive(ip("10.0.0.1"));
    closed.wait_for_client().expect("a slot");
    drop(closed);
    let mut done = a.arrive(ip("10.0.0.2"));
    done.wait_for_client().expect("a slot");
    let connected = done.promote(|| false).expect("room");
    let now = Instant::now();
    let mut pending = a.pending.lock();
    assert!(pending
        .stalled
        .closed_lately(source_key(ip("10.0.0.1")), now));
    assert!(!pending.stalled.lately(source_key(ip("10.0.0.2")), now));
    drop(pending);
    drop(connected);
}

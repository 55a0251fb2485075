//! The link the relay imitates, free of I/O: when a chunk read from one side
//! is due at the other, when the upstream connection is made, how many bytes
//! may be in flight in each direction, and which deliveries the event log
//! records one by one. Times are offsets from the moment the relay accepted
//! the client's connection.

use std::collections::VecDeque;
use std::time::Duration;

/// Which way a chunk travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the client that connected to the relay, to the target.
    ToServer,
    /// From the target back to the client.
    ToClient,
}

impl Direction {
    /// The name used in the event log.
    pub fn name(self) -> &'static str {
        match self {
            Direction::ToServer => "c2s",
            Direction::ToClient => "s2c",
        }
    }
}

/// A path with the same fixed delay in each direction.
///
/// TCP's handshake is modelled too. On a real path a client's SYN leaves at
/// 0, reaches the server at one one-way delay, the SYN-ACK is back at 1 RTT
/// (connect() returns and the client sends), and the client's ACK and first
/// bytes reach the server at 1.5 RTT, when the server's accept() returns; the
/// server's first bytes reach the client at 2 RTT. On loopback the client's
/// connect() returns at once, so the relay connects to the target only at
/// 1.5 RTT and holds what the client sent meanwhile until then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    one_way: Duration,
}

impl Link {
    /// A link with `one_way` of delay in each direction (RTT = 2 x one_way).
    pub fn new(one_way: Duration) -> Self {
        Link { one_way }
    }

    pub fn one_way(&self) -> Duration {
        self.one_way
    }

    pub fn rtt(&self) -> Duration {
        self.one_way * 2
    }

    /// When the relay connects to the target: when the handshake's last
    /// packet would reach the server (1.5 RTT after the client's connect).
    pub fn upstream_connect_at(&self) -> Duration {
        self.one_way * 3
    }

    /// When a chunk read at `read_at` is due at the other side.
    pub fn due(&self, dir: Direction, read_at: Duration) -> Duration {
        let arrives = read_at + self.one_way;
        match dir {
            Direction::ToServer => arrives.max(self.upstream_connect_at()),
            Direction::ToClient => arrives,
        }
    }
}

/// Bytes per second the default in-flight budget is sized for.
pub const DEFAULT_RATE: u64 = 1_000_000_000;
/// The smallest default in-flight budget per direction.
pub const MIN_DEFAULT_IN_FLIGHT: usize = 4 << 20;

/// The default in-flight budget of one direction: enough for
/// [`DEFAULT_RATE`] over one RTT, and at least [`MIN_DEFAULT_IN_FLIGHT`].
pub fn default_in_flight(link: &Link) -> usize {
    let bytes = DEFAULT_RATE as u128 * link.rtt().as_nanos() / 1_000_000_000;
    usize::try_from(bytes)
        .unwrap_or(usize::MAX)
        .max(MIN_DEFAULT_IN_FLIGHT)
}

/// A chunk waiting for its time.
#[derive(Debug, PartialEq, Eq)]
pub struct Pending<T> {
    pub due: Duration,
    pub len: usize,
    pub item: T,
}

/// One direction of a connection: chunks in the order they were read, each
/// with the time it is due, and the bytes in flight (read from the source
/// and not yet written to the destination) against a budget. A full budget
/// stops the reading, as a full link would: back-pressure, not an
/// unbounded buffer.
#[derive(Debug)]
pub struct Pipe<T> {
    queue: VecDeque<Pending<T>>,
    in_flight: usize,
    capacity: usize,
    last_due: Duration,
}

impl<T> Pipe<T> {
    /// A pipe that holds at most `capacity` bytes in flight (at least 1).
    pub fn new(capacity: usize) -> Self {
        Pipe {
            queue: VecDeque::new(),
            in_flight: 0,
            capacity: capacity.max(1),
            last_due: Duration::ZERO,
        }
    }

    /// How many more bytes may be read now.
    pub fn room(&self) -> usize {
        self.capacity.saturating_sub(self.in_flight)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Queues a chunk of `len` bytes due at `due`; returns the time it will
    /// be delivered, never before an earlier chunk's (byte order is kept).
    pub fn push(&mut self, due: Duration, len: usize, item: T) -> Duration {
        let due = due.max(self.last_due);
        self.last_due = due;
        self.in_flight += len;
        self.queue.push_back(Pending { due, len, item });
        due
    }

    /// When the oldest chunk is due, if any is queued.
    pub fn next_due(&self) -> Option<Duration> {
        self.queue.front().map(|p| p.due)
    }

    /// The oldest chunk, if it is due at `now`. Its bytes stay in flight
    /// until [`Pipe::release`] says they were written.
    pub fn pop_due(&mut self, now: Duration) -> Option<Pending<T>> {
        if self.queue.front()?.due <= now {
            self.queue.pop_front()
        } else {
            None
        }
    }

    /// `len` bytes of a popped chunk reached the destination.
    pub fn release(&mut self, len: usize) {
        self.in_flight = self.in_flight.saturating_sub(len);
    }
}

/// A line of the event log about deliveries in one direction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Delivery {
    /// One chunk: when it was delivered, its size and the bytes delivered so
    /// far in this direction (this chunk included).
    Chunk {
        at: Duration,
        len: usize,
        total: u64,
    },
    /// Several chunks delivered between `from` and `to`, coalesced.
    Batch {
        from: Duration,
        to: Duration,
        chunks: u64,
        bytes: u64,
        total: u64,
    },
}

/// Decides what the event log says about deliveries: the first `detailed`
/// chunks one line each (the early ones, which round-trip counting reads),
/// then one line per `interval` at most, so a gigabyte run writes a few
/// hundred lines, not tens of thousands.
#[derive(Debug)]
pub struct DeliveryLog {
    detailed_left: u64,
    interval: Duration,
    total: u64,
    batch: Option<(Duration, Duration, u64, u64)>,
}

impl DeliveryLog {
    pub fn new(detailed: u64, interval: Duration) -> Self {
        DeliveryLog {
            detailed_left: detailed,
            interval,
            total: 0,
            batch: None,
        }
    }

    /// Bytes delivered so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// A chunk of `len` bytes was delivered at `at`: the line to log, if any.
    pub fn delivered(&mut self, at: Duration, len: usize) -> Option<Delivery> {
        self.total += len as u64;
        if self.detailed_left > 0 {
            self.detailed_left -= 1;
            return Some(Delivery::Chunk {
                at,
                len,
                total: self.total,
            });
        }
        let (from, to, chunks, bytes) = self.batch.get_or_insert((at, at, 0, 0));
        *to = at;
        *chunks += 1;
        *bytes += len as u64;
        if at.saturating_sub(*from) >= self.interval {
            return self.finish();
        }
        None
    }

    /// What is left to log (at the end of the direction).
    pub fn finish(&mut self) -> Option<Delivery> {
        let (from, to, chunks, bytes) = self.batch.take()?;
        Some(Delivery::Batch {
            from,
            to,
            chunks,
            bytes,
            total: self.total,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn handshake_times_follow_tcp() {
        let link = Link::new(ms(20));
        assert_eq!(link.rtt(), ms(40));
        // The target sees the connection at 1.5 RTT ...
        assert_eq!(link.upstream_connect_at(), ms(60));
        // ... what the client sent at once arrives then, not earlier ...
        assert_eq!(link.due(Direction::ToServer, ms(0)), ms(60));
        assert_eq!(link.due(Direction::ToServer, ms(39)), ms(60));
        // ... and the server's first bytes, sent when it accepts, reach the
        // client at 2 RTT.
        assert_eq!(
            link.due(Direction::ToClient, link.upstream_connect_at()),
            ms(80)
        );
    }

    #[test]
    fn after_the_handshake_each_way_costs_one_delay() {
        let link = Link::new(ms(20));
        assert_eq!(link.due(Direction::ToServer, ms(100)), ms(120));
        assert_eq!(link.due(Direction::ToClient, ms(100)), ms(120));
        // A request answered at once costs one RTT.
        let at_server = link.due(Direction::ToServer, ms(100));
        assert_eq!(link.due(Direction::ToClient, at_server) - ms(100), ms(40));
    }

    #[test]
    fn zero_delay_is_a_plain_relay() {
        let link = Link::new(Duration::ZERO);
        assert_eq!(link.upstream_connect_at(), Duration::ZERO);
        assert_eq!(link.due(Direction::ToServer, ms(5)), ms(5));
    }

    #[test]
    fn default_budget_is_a_gigabyte_per_second_times_the_rtt() {
        assert_eq!(default_in_flight(&Link::new(ms(20))), 40_000_000);
        assert_eq!(
            default_in_flight(&Link::new(ms(1))),
            MIN_DEFAULT_IN_FLIGHT,
            "floor"
        );
    }

    #[test]
    fn pipe_keeps_order_and_time() {
        let mut p = Pipe::new(100);
        assert_eq!(p.next_due(), None);
        assert_eq!(p.push(ms(60), 10, 'a'), ms(60));
        // A later chunk computed as due earlier (e.g. read before the
        // handshake ended) never overtakes.
        assert_eq!(p.push(ms(50), 10, 'b'), ms(60));
        assert_eq!(p.push(ms(70), 10, 'c'), ms(70));
        assert_eq!(p.pop_due(ms(59)), None);
        assert_eq!(p.pop_due(ms(60)).map(|c| c.item), Some('a'));
        assert_eq!(p.pop_due(ms(60)).map(|c| c.item), Some('b'));
        assert_eq!(p.next_due(), Some(ms(70)));
        assert_eq!(p.pop_due(ms(69)), None);
        assert_eq!(p.pop_due(ms(80)).map(|c| (c.item, c.len)), Some(('c', 10)));
        assert_eq!(p.pop_due(ms(90)), None);
    }

    #[test]
    fn pipe_budget_counts_until_written() {
        let mut p = Pipe::new(25);
        assert_eq!(p.room(), 25);
        p.push(ms(1), 10, ());
        p.push(ms(1), 10, ());
        assert_eq!(p.room(), 5);
        p.push(ms(1), 10, ()); // a read may overshoot by its own size
        assert_eq!(p.room(), 0);
        assert_eq!(p.in_flight(), 30);
        let c = p.pop_due(ms(1)).unwrap();
        assert_eq!(p.room(), 0, "popped but not yet written");
        p.release(c.len);
        assert_eq!(p.room(), 5);
        p.release(1000);
        assert_eq!(p.in_flight(), 0);
        assert_eq!(Pipe::<()>::new(0).room(), 1, "a zero budget would deadlock");
    }

    #[test]
    fn delivery_log_details_the_first_chunks_then_coalesces() {
        let mut log = DeliveryLog::new(2, ms(100));
        assert_eq!(
            log.delivered(ms(1), 5),
            Some(Delivery::Chunk {
                at: ms(1),
                len: 5,
                total: 5
            })
        );
        assert_eq!(
            log.delivered(ms(2), 5),
            Some(Delivery::Chunk {
                at: ms(2),
                len: 5,
                total: 10
            })
        );
        assert_eq!(log.delivered(ms(3), 1), None);
        assert_eq!(log.delivered(ms(50), 1), None);
        assert_eq!(
            log.delivered(ms(103), 1),
            Some(Delivery::Batch {
                from: ms(3),
                to: ms(103),
                chunks: 3,
                bytes: 3,
                total: 13
            })
        );
        assert_eq!(log.finish(), None);
        assert_eq!(log.delivered(ms(200), 7), None);
        assert_eq!(
            log.finish(),
            Some(Delivery::Batch {
                from: ms(200),
                to: ms(200),
                chunks: 1,
                bytes: 7,
                total: 20
            })
        );
        assert_eq!(log.total(), 20);
    }
}

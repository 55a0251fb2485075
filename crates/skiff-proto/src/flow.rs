//! skiff's per-channel flow control between a skiff client and skiffd.
//!
//! The SSH library both use grants channel window as data arrives, not as
//! the program at the other end reads it, so one channel whose reader stops
//! would otherwise hold up every channel of its connection. skiff adds two
//! extensions, used only between skiff and skiffd (a client uses them only
//! toward a server whose identification line says skiffd, and skiffd only
//! answers a client that asked):
//!
//! * Output: the client sends the `signal` [`PAUSE_OUTPUT`] when much of a
//!   command's output is queued for a slow local reader, and
//!   [`RESUME_OUTPUT`] when it has drained. skiffd stops and restarts
//!   reading the command's stdout and stderr (or its terminal). These
//!   signal no process.
//! * Input: a client that sends the `signal` [`INPUT_ACKS`] gets extended
//!   data of type [`INPUT_CONSUMED`] on that channel: the number of input
//!   bytes the command has read so far, as an 8-byte big-endian integer.
//!   skiffd sends one at once (which tells the client it is understood) and
//!   then one per [`INPUT_ACK_STEP`] bytes read. The client then keeps at
//!   most [`INPUT_CREDIT`] bytes sent but not yet read.
//!
//! Names are local `name@domain` names (RFC 4250 section 4.6.1); the data
//! type code is from the private-use range (RFC 4250 section 4.4.1).

/// `signal` name: stop reading the command's output.
pub const PAUSE_OUTPUT: &str = "pause-output@skiff";
/// `signal` name: read the command's output again.
pub const RESUME_OUTPUT: &str = "resume-output@skiff";
/// `signal` name: report how much input the command has read.
pub const INPUT_ACKS: &str = "input-acks@skiff";
/// Extended-data type code of an input report.
pub const INPUT_CONSUMED: u32 = 0xfe73_6b66;
/// skiffd reports after each this many bytes read.
pub const INPUT_ACK_STEP: u64 = 4 << 20;
/// Input a client keeps in flight once reports come. Larger than
/// [`INPUT_ACK_STEP`], so that a command that read everything always frees
/// the client to send more; below skiffd's 64 MiB input backlog, so that a
/// command that reads nothing never fills it; and large enough not to limit
/// a fast path (48 MiB per round trip is 1.2 GB/s at 40 ms).
pub const INPUT_CREDIT: u64 = 48 << 20;

const _: () = assert!(INPUT_CREDIT > INPUT_ACK_STEP);

/// The payload of an input report.
pub fn encode_consumed(total: u64) -> [u8; 8] {
    total.to_be_bytes()
}

/// The total an input report carries, if it is one.
pub fn decode_consumed(data: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(data.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip_and_bad_lengths_are_no_report() {
        for total in [0, 1, INPUT_ACK_STEP, u64::MAX] {
            assert_eq!(decode_consumed(&encode_consumed(total)), Some(total));
        }
        assert_eq!(decode_consumed(&[0; 7]), None);
        assert_eq!(decode_consumed(&[0; 9]), None);
    }
}

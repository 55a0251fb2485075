//! `RekeyLimit DATA [TIME]` (sshd's syntax): after how many bytes, or how
//! much time, skiffd starts a new key exchange on a connection. Pure: the
//! listener hands the result to russh (`russh::Limits`).

use std::time::Duration;

/// `RekeyLimit DATA [TIME]`: a new key exchange starts once this many
/// bytes have gone either way, or this much time has passed, since the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RekeyLimit {
    /// Bytes, at most [`RekeyLimit::MAX_DATA`].
    pub data: usize,
    /// `None`: no time limit.
    pub time: Option<Duration>,
}

impl Default for RekeyLimit {
    /// 1 GiB or one hour (sshd's default has no time limit; skiffd keeps
    /// the hourly re-key it has always done).
    fn default() -> Self {
        RekeyLimit {
            data: RekeyLimit::MAX_DATA,
            time: Some(Duration::from_secs(3600)),
        }
    }
}

impl RekeyLimit {
    /// The most data one set of keys carries: russh's bound, which keeps
    /// every cipher's nonces and counters far from wrapping. `default`,
    /// `none` and larger sizes mean this.
    pub const MAX_DATA: usize = 1 << 30;

    /// Parses sshd's `DATA [TIME]`: DATA is `default`, `none` or a size in
    /// bytes with an optional `K`, `M` or `G` suffix (at least 16); TIME is
    /// `default` or `none` (no time limit) or a time (`1h`, `30m`, `90`).
    /// Without TIME, the time limit stays as it was.
    pub fn parse(args: &[&str], current: RekeyLimit) -> Result<RekeyLimit, String> {
        let (data, time) = match args {
            [data] => (*data, None),
            [data, time] => (*data, Some(*time)),
            _ => return Err("RekeyLimit takes a data limit and optionally a time limit".into()),
        };
        let data = match data.to_ascii_lowercase().as_str() {
            "default" | "none" => RekeyLimit::MAX_DATA,
            v => {
                let (digits, scale) = match v.as_bytes().last() {
                    Some(b'k') => (&v[..v.len() - 1], 1u64 << 10),
                    Some(b'm') => (&v[..v.len() - 1], 1 << 20),
                    Some(b'g') => (&v[..v.len() - 1], 1 << 30),
                    _ => (v, 1),
                };
                let bytes = digits
                    .parse::<u64>()
                    .ok()
                    .and_then(|n| n.checked_mul(scale))
                    .filter(|n| *n >= 16)
                    .ok_or_else(|| {
                        format!(
                            "RekeyLimit {data:?}: expected default, none or a size of at least 16 \
                             bytes, optionally with K, M or G"
                        )
                    })?;
                usize::try_from(bytes)
                    .unwrap_or(usize::MAX)
                    .min(RekeyLimit::MAX_DATA)
            }
        };
        let time = match time.map(str::to_ascii_lowercase).as_deref() {
            None => current.time,
            Some("none") | Some("default") => None,
            Some(t) => {
                let d = crate::config::parse_duration(t).map_err(|e| format!("RekeyLimit: {e}"))?;
                (!d.is_zero()).then_some(d)
            }
        };
        Ok(RekeyLimit { data, time })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<RekeyLimit, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        RekeyLimit::parse(&words, RekeyLimit::default())
    }

    #[test]
    fn sizes_times_and_keywords() {
        let hour = Some(Duration::from_secs(3600));
        assert_eq!(
            parse("1M").unwrap(),
            RekeyLimit {
                data: 1 << 20,
                time: hour
            }
        );
        assert_eq!(parse("512k 30m").unwrap().data, 512 << 10);
        assert_eq!(
            parse("512K 30m").unwrap().time,
            Some(Duration::from_secs(1800))
        );
        assert_eq!(parse("100000").unwrap().data, 100_000);
        assert_eq!(
            parse("default none").unwrap(),
            RekeyLimit {
                data: RekeyLimit::MAX_DATA,
                time: None
            }
        );
        assert_eq!(
            parse("none 1h30m").unwrap().time,
            Some(Duration::from_secs(5400))
        );
        assert_eq!(parse("1G 0").unwrap().time, None);
        // Above russh's bound: the bound.
        assert_eq!(parse("4G").unwrap().data, RekeyLimit::MAX_DATA);
        assert!(parse("99999999999999G").unwrap_err().contains("size"));
        for bad in ["", "15", "1X", "M", "-1M", "1M 1y", "1M 1h extra"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}

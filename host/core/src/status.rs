//! How a response was served: the value of its `Cache-Status` field
//! (RFC 9211) and the short form in the access log.

use std::borrow::Cow;

use http::{HeaderName, HeaderValue};

/// The `Cache-Status` field name (RFC 9211).
pub const CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// How a response was served. Every response has exactly one; until the
/// host knows better, it is [`CacheStatus::Error`] (the default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CacheStatus {
    /// A fresh object from the cache, with its freshness left in seconds.
    Hit {
        /// Seconds of freshness left.
        ttl_left: u64,
    },
    /// An expired object served stale.
    Stale {
        /// Seconds since it expired.
        stale_for: u64,
        /// Why a stale object was acceptable.
        reason: StaleReason,
    },
    /// An expired object the origin confirmed unchanged (304).
    Revalidated,
    /// Fetched from the origin for the cache.
    Miss {
        /// The response is being stored.
        stored: bool,
    },
    /// Fetched without waiting for other requests, because the key was
    /// recently uncacheable (Varnish's hit-for-miss).
    HitForMiss {
        /// The response turned out cacheable and is being stored.
        stored: bool,
    },
    /// The cache was not used (the built-in rules or the policy said pass).
    Pass,
    /// The policy answered the request itself.
    Synthetic,
    /// A PURGE request.
    Purge,
    /// The request failed; the response is an error page.
    #[default]
    Error,
}

/// Why a stale object was served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StaleReason {
    /// Within its grace time, while one background fetch refreshes it
    /// (`stale-while-revalidate`).
    Grace,
    /// The origin failed, and the object is within its keep time
    /// (`stale-if-error`).
    StaleIfError,
}

impl CacheStatus {
    /// The `Cache-Status` field value (RFC 9211), with `inlay` as the
    /// cache's name: static for the statuses without numbers.
    pub fn header_value(&self) -> Cow<'static, str> {
        Cow::Borrowed(match self {
            Self::Hit { ttl_left } => return format!("inlay; hit; ttl={ttl_left}").into(),
            Self::Stale { stale_for, reason } => {
                let reason = match reason {
                    StaleReason::Grace => "grace",
                    StaleReason::StaleIfError => "stale-if-error",
                };
                return format!("inlay; hit; ttl=-{stale_for}; detail={reason}").into();
            }
            Self::HitForMiss { stored: true } => "inlay; fwd=miss; stored; detail=hit-for-miss",
            Self::HitForMiss { stored: false } => "inlay; fwd=miss; detail=hit-for-miss",
            Self::Revalidated => "inlay; fwd=stale; fwd-status=304",
            Self::Miss { stored: true } => "inlay; fwd=miss; stored",
            Self::Miss { stored: false } => "inlay; fwd=miss",
            Self::Pass => "inlay; fwd=bypass",
            Self::Synthetic => "inlay; detail=synthetic",
            Self::Purge => "inlay; detail=purge",
            Self::Error => "inlay; detail=error",
        })
    }

    /// [`header_value`](Self::header_value) as a field value (no
    /// allocation for a status without numbers: a pass, a miss).
    pub fn field(&self) -> HeaderValue {
        match self.header_value() {
            Cow::Borrowed(v) => HeaderValue::from_static(v),
            // Digits, letters and "; =-" are a valid field value.
            Cow::Owned(v) => HeaderValue::try_from(v).unwrap_or(HeaderValue::from_static("inlay")),
        }
    }

    /// The short form for the access log's `cache` field.
    pub fn log_name(&self) -> &'static str {
        match self {
            Self::Hit { .. } => "hit",
            Self::Stale { .. } => "stale",
            Self::Revalidated => "revalidated",
            Self::Miss { .. } => "miss",
            Self::HitForMiss { .. } => "hitmiss",
            Self::Pass => "pass",
            Self::Synthetic => "synth",
            Self::Purge => "purge",
            Self::Error => "error",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_follow_rfc_9211() {
        let cases = [
            (
                CacheStatus::Hit { ttl_left: 60 },
                "inlay; hit; ttl=60",
                "hit",
            ),
            (
                CacheStatus::Stale {
                    stale_for: 3,
                    reason: StaleReason::Grace,
                },
                "inlay; hit; ttl=-3; detail=grace",
                "stale",
            ),
            (
                CacheStatus::Stale {
                    stale_for: 0,
                    reason: StaleReason::StaleIfError,
                },
                "inlay; hit; ttl=-0; detail=stale-if-error",
                "stale",
            ),
            (
                CacheStatus::Revalidated,
                "inlay; fwd=stale; fwd-status=304",
                "revalidated",
            ),
            (
                CacheStatus::Miss { stored: true },
                "inlay; fwd=miss; stored",
                "miss",
            ),
            (
                CacheStatus::Miss { stored: false },
                "inlay; fwd=miss",
                "miss",
            ),
            (
                CacheStatus::HitForMiss { stored: false },
                "inlay; fwd=miss; detail=hit-for-miss",
                "hitmiss",
            ),
            (CacheStatus::Pass, "inlay; fwd=bypass", "pass"),
            (CacheStatus::Synthetic, "inlay; detail=synthetic", "synth"),
            (CacheStatus::Error, "inlay; detail=error", "error"),
        ];
        for (status, header, log) in cases {
            assert_eq!(status.header_value(), header);
            assert_eq!(status.field(), header, "{status:?}");
            assert_eq!(status.log_name(), log);
        }
    }
}

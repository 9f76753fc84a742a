//! How ranks agree on the outcome of a step: every rank contributes one fixed-size
//! status frame (JSON, NUL-padded), and every rank raises the first failure in rank
//! order. The one definition of that frame, for the Rust runtime's c10d steps and the
//! Python package's collectives alike.

use serde::{Deserialize, Serialize};

/// Bytes of the fixed-size status every rank contributes.
pub const STATUS_BYTES: usize = 1024;

/// One rank's outcome of a step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Status {
    /// The rank succeeded.
    Ok,
    /// The source of this rank's group failed (`rank` global).
    Source {
        /// The failing source rank.
        rank: usize,
        /// Index of the sample in the serial dataset, where known.
        sample: Option<usize>,
        /// What failed.
        message: String,
    },
    /// This rank failed on what it received or computed.
    Rank {
        /// The failing rank.
        rank: usize,
        /// The error's type name where the language has one (Python's exception
        /// class), so every rank can raise the same type.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kind: Option<String>,
        /// What failed.
        message: String,
    },
}

impl Status {
    /// JSON, NUL-padded to [`STATUS_BYTES`]; a long message is cut to fit (at a char
    /// boundary, ending in `…`).
    pub fn encode(&self) -> Vec<u8> {
        let mut status = self.clone();
        loop {
            let mut json =
                serde_json::to_vec(&status).unwrap_or_else(|_| b"{\"status\":\"ok\"}".to_vec());
            if json.len() <= STATUS_BYTES {
                json.resize(STATUS_BYTES, 0);
                return json;
            }
            match &mut status {
                Status::Source { message, .. } | Status::Rank { message, .. } => {
                    let over = json.len() - STATUS_BYTES + 8;
                    let mut keep = message.len().saturating_sub(over);
                    while !message.is_char_boundary(keep) {
                        keep -= 1;
                    }
                    message.truncate(keep);
                    message.push('…');
                }
                // An ok status is a dozen bytes; nothing to shorten.
                Status::Ok => {
                    json.truncate(STATUS_BYTES);
                    return json;
                }
            }
        }
    }

    /// The status in a frame [`Status::encode`] wrote; `None` for one it did not.
    pub fn decode(bytes: &[u8]) -> Option<Status> {
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        serde_json::from_slice(&bytes[..end]).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_round_trips_in_one_frame() {
        let long = "é".repeat(2 * STATUS_BYTES);
        for s in [
            Status::Ok,
            Status::Source {
                rank: 3,
                sample: Some(7),
                message: "feature `x`: bad".into(),
            },
            Status::Rank {
                rank: 1,
                kind: Some("TypeError".into()),
                message: "no".into(),
            },
            Status::Rank {
                rank: 0,
                kind: None,
                message: long.clone(),
            },
        ] {
            let frame = s.encode();
            assert_eq!(frame.len(), STATUS_BYTES);
            let back = Status::decode(&frame).expect("decodes");
            match (&s, &back) {
                (Status::Rank { message, .. }, Status::Rank { message: got, .. })
                    if message == &long =>
                {
                    assert!(got.ends_with('…') && long.starts_with(got.trim_end_matches('…')));
                }
                _ => assert_eq!(back, s),
            }
        }
        assert_eq!(Status::decode(b"\x01garbage"), None);
    }
}

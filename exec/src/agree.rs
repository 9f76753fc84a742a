//! How ranks agree on a step, for the Rust runtime's c10d steps and the Python
//! package's collectives alike: one definition of what they exchange.
//!
//! Each rank votes: whether it failed, and a digest of its [`Terms`] (the spec, the
//! workflow, the mesh and its rank order, the source) and its negation, in two values
//! ([`vote`]). One all-reduce of max over the world tells whether every rank succeeded
//! on the same terms ([`unanimous`]). Only when not do the ranks exchange one fixed-size [`Status`] frame
//! each (JSON, NUL-padded): its failure, or its terms; [`verdict`] then gives every rank
//! the same outcome, the first failure in rank order or the first disagreement, naming
//! both sides.

use featshard_spec::sha256_hex;
use serde::{Deserialize, Serialize};

/// Bytes of the fixed-size status every rank contributes.
pub const STATUS_BYTES: usize = 1024;

/// Length of a vote: two values. gloo reduces a vector of one or two values in a
/// couple of rounds, and one as long as the world in a ring of `2 (n - 1)`: on 8 CPU
/// ranks 1.6 ms against 11 ms a vote (`benches/README.md`, the step's fixed cost).
pub(crate) const VOTE_LEN: usize = 2;

/// A failed rank's first value: above every digest word.
const FAILED: i64 = i64::MAX;

/// The sampler's term, as a disagreement names it.
const SAMPLER: &str = "what decides the step's sample";

/// Characters of a name or value kept in a frame (digests cover the whole value).
const CLIP: usize = 64;

/// Ranks listed by name in a frame's rank order; the rest by count and digest.
const LISTED: usize = 12;

/// What every rank of a step must hold the same: two ranks that differ here would
/// build different DTensors from the same bytes, or wait for peers that never come.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Terms {
    /// The sha256 of the spec the rank's plan was made from.
    pub spec: String,
    /// The workflow the rank asked for (`None`: every feature of the spec).
    #[serde(default)]
    pub workflow: Option<String>,
    /// The mesh's axes by name and size, in order (`dp=2, cp0=3, cp1=3`).
    pub mesh: String,
    /// The mesh's global ranks in its order (row-major), listed or summarised.
    pub order: String,
    /// The source's place in its CP group (the same on every replica), where the step
    /// has a source.
    #[serde(default)]
    pub source: Option<usize>,
    /// What decides which sample the step holds, where a loader chose it (its sampler's
    /// seed, epoch, shuffle, dataset length, turns, batch size, drop_last and the step's
    /// number): ranks that differ here deliver different samples as one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampler: Option<String>,
    /// sha256 of every value above, whole: what the vote compares.
    pub digest: String,
}

impl Terms {
    /// The terms of a rank: its plan's spec hash, its workflow, its mesh's axes (names
    /// and sizes, in order) and global ranks in mesh order, and its source's place in
    /// the CP group.
    pub fn new(
        spec: &str,
        workflow: Option<&str>,
        axes: &[(String, usize)],
        ranks: &[usize],
        source: Option<usize>,
    ) -> Terms {
        let mesh = axes
            .iter()
            .map(|(n, s)| format!("{n}={s}"))
            .collect::<Vec<_>>()
            .join(", ");
        let whole = serde_json::json!([spec, workflow, axes, ranks, source]).to_string();
        let ranks_digest = sha256_hex(&serde_json::json!(ranks).to_string());
        Terms {
            spec: clip(spec),
            workflow: workflow.map(clip),
            mesh: clip_to(&mesh, 4 * CLIP),
            order: order_of(ranks, &ranks_digest),
            source,
            sampler: None,
            digest: sha256_hex(&whole),
        }
    }

    /// These terms with what decided the step's sample (`Terms::sampler`) among them.
    pub fn with_sampler(mut self, sampler: &str) -> Terms {
        self.digest = sha256_hex(&serde_json::json!([self.digest, sampler]).to_string());
        self.sampler = Some(clip_to(sampler, 4 * CLIP));
        self
    }

    /// The digest's first 60 bits, what a vote compares (ranks whose terms differ by
    /// chance in no other bit are 1 in 2^60; the frames then compare every term).
    pub(crate) fn word(&self) -> i64 {
        let hex = self.digest.get(..15).unwrap_or("");
        i64::from_str_radix(hex, 16).unwrap_or(0)
    }

    /// The first term on which `other` differs: what it is called, this side's value
    /// and the other's.
    fn difference(&self, other: &Terms) -> Option<(&'static str, String, String)> {
        let opt = |w: &Option<String>| w.as_deref().map_or("every feature".into(), quoted);
        let src = |s: &Option<usize>| s.map_or("none".into(), |k| format!("CP group rank {k}"));
        let fields = [
            ("the spec (sha256)", quoted(&self.spec), quoted(&other.spec)),
            ("the mesh", quoted(&self.mesh), quoted(&other.mesh)),
            (
                "the mesh's rank order",
                self.order.clone(),
                other.order.clone(),
            ),
            // After the mesh: a rank making its groups for a mesh the others already
            // have differs from their step's terms in the workflow too.
            ("the workflow", opt(&self.workflow), opt(&other.workflow)),
            ("the source", src(&self.source), src(&other.source)),
            (
                SAMPLER,
                opt_sampler(&self.sampler),
                opt_sampler(&other.sampler),
            ),
            (
                "their terms (digest)",
                self.digest.clone(),
                other.digest.clone(),
            ),
        ];
        fields.into_iter().find(|(_, a, b)| a != b)
    }
}

fn opt_sampler(s: &Option<String>) -> String {
    s.as_deref().map_or("no loader's".into(), quoted)
}

fn quoted(s: &str) -> String {
    format!("`{s}`")
}

fn clip(s: &str) -> String {
    clip_to(s, CLIP)
}

/// `s` cut to `n` characters, ending in `…` where it was cut.
fn clip_to(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

fn order_of(ranks: &[usize], digest: &str) -> String {
    if ranks.len() <= LISTED {
        return format!("{ranks:?}");
    }
    let head: Vec<String> = ranks[..LISTED].iter().map(usize::to_string).collect();
    format!(
        "[{}, …] ({} ranks, #{})",
        head.join(", "),
        ranks.len(),
        &digest[..8.min(digest.len())]
    )
}

/// One rank's vote: its terms' digest word `d` (0 without terms) as `[d, -d]`, the
/// first [`FAILED`] where it failed. All-reduced by max over the world.
pub fn vote(failed: bool, terms: Option<&Terms>) -> [i64; VOTE_LEN] {
    let d = terms.map_or(0, Terms::word);
    [if failed { FAILED } else { d }, -d]
}

/// Whether the votes reduced by max say every rank succeeded on the same terms: no
/// rank failed, and the largest digest word is the smallest (the negated largest
/// negation).
pub fn unanimous(reduced: &[i64]) -> bool {
    reduced.len() == VOTE_LEN && reduced[0] != FAILED && reduced[0] == reduced[1].wrapping_neg()
}

/// One rank's outcome of a step, or its terms when it succeeded on a step the ranks
/// did not agree on.
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
    /// This rank succeeded on these terms (sent only when the vote found the ranks'
    /// terms, or their outcomes, differ).
    Terms {
        /// The rank.
        rank: usize,
        /// What it holds.
        terms: Terms,
    },
    /// The ranks disagree on their terms: the verdict every rank returns.
    Disagree {
        /// Which term, and both sides.
        message: String,
    },
}

impl Status {
    /// JSON, NUL-padded to [`STATUS_BYTES`]; a long message is cut to fit (at a char
    /// boundary, ending in `…`). Any text fits: JSON escapes what it must.
    pub fn encode(&self) -> Vec<u8> {
        let mut status = self.clone();
        if let Status::Rank {
            kind: Some(kind), ..
        } = &mut status
        {
            *kind = clip(kind);
        }
        loop {
            let mut json =
                serde_json::to_vec(&status).unwrap_or_else(|_| b"{\"status\":\"ok\"}".to_vec());
            if json.len() <= STATUS_BYTES {
                json.resize(STATUS_BYTES, 0);
                return json;
            }
            match &mut status {
                Status::Source { message, .. }
                | Status::Rank { message, .. }
                | Status::Disagree { message } => {
                    let over = json.len() - STATUS_BYTES + 8;
                    let mut keep = message.len().saturating_sub(over);
                    while !message.is_char_boundary(keep) {
                        keep -= 1;
                    }
                    message.truncate(keep);
                    message.push('…');
                }
                // Terms are clipped when made, and an ok status is a dozen bytes:
                // neither reaches the limit.
                Status::Ok | Status::Terms { .. } => {
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

    /// Whether this is a failure (or a disagreement) rather than a success.
    pub fn failed(&self) -> bool {
        !matches!(self, Status::Ok | Status::Terms { .. })
    }
}

/// What one rank sends when the vote was not unanimous: its failure, or its terms.
pub fn frame_of(rank: usize, status: &Status, terms: Option<&Terms>) -> Status {
    match (status.failed(), terms) {
        (false, Some(t)) => Status::Terms {
            rank,
            terms: t.clone(),
        },
        _ => status.clone(),
    }
}

/// Every rank's frame, in rank order, to the one outcome every rank returns: the first
/// failure, else the first rank whose terms differ from the lowest rank's (named with
/// both values), else success. A frame no rank wrote is a failure of its rank.
pub fn verdict(frames: &[Option<Status>]) -> Status {
    for (rank, f) in frames.iter().enumerate() {
        match f {
            None => {
                return Status::Rank {
                    rank,
                    kind: None,
                    message: format!("rank {rank} sent a status frame no featshard rank wrote"),
                }
            }
            Some(s) if s.failed() => return s.clone(),
            Some(_) => {}
        }
    }
    let terms: Vec<(usize, &Terms)> = frames
        .iter()
        .filter_map(|f| match f {
            Some(Status::Terms { rank, terms }) => Some((*rank, terms)),
            _ => None,
        })
        .collect();
    let Some(&(first, base)) = terms.first() else {
        return Status::Ok;
    };
    for &(rank, t) in &terms[1..] {
        if let Some((what, mine, theirs)) = base.difference(t) {
            let rule = match what {
                SAMPLER => "every rank's loader must draw the same sequence: the same dataset length, shuffle, seed, epoch, spread, batch_size and drop_last, at the same step",
                _ => "every rank of the world must call with the same spec, workflow, mesh and source",
            };
            return Status::Disagree {
                message: format!(
                    "ranks disagree on {what}: rank {first} has {mine}, rank {rank} has {theirs} ({rule})"
                ),
            };
        }
    }
    Status::Ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axes(v: &[(&str, usize)]) -> Vec<(String, usize)> {
        v.iter().map(|&(n, s)| (n.to_owned(), s)).collect()
    }

    fn terms(workflow: Option<&str>, ranks: &[usize], source: Option<usize>) -> Terms {
        Terms::new(
            "ab12",
            workflow,
            &axes(&[("cp0", 2), ("cp1", 2)]),
            ranks,
            source,
        )
    }

    fn reduce(votes: &[[i64; VOTE_LEN]]) -> Vec<i64> {
        (0..VOTE_LEN)
            .map(|i| votes.iter().map(|v| v[i]).max().unwrap_or(0))
            .collect()
    }

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
            Status::Terms {
                rank: 2,
                terms: terms(
                    Some(&"w".repeat(5000)),
                    &(0..65_536).collect::<Vec<_>>(),
                    Some(0),
                ),
            },
            Status::Disagree {
                message: "x".repeat(5000),
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
                (Status::Disagree { .. }, Status::Disagree { message }) => {
                    assert!(message.ends_with('…'))
                }
                _ => assert_eq!(back, s),
            }
        }
        assert_eq!(Status::decode(b"\x01garbage"), None);
    }

    #[test]
    fn a_vote_is_unanimous_only_when_every_rank_succeeded_on_the_same_terms() {
        let a = terms(Some("inference"), &[0, 1, 2, 3], Some(0));
        let same = terms(Some("inference"), &[0, 1, 2, 3], Some(0));
        assert!(unanimous(&reduce(&[
            vote(false, Some(&a)),
            vote(false, Some(&same))
        ])));
        assert!(!unanimous(&reduce(&[
            vote(false, Some(&a)),
            vote(true, Some(&same))
        ])));
        for other in [
            terms(Some("training"), &[0, 1, 2, 3], Some(0)),
            terms(None, &[0, 1, 2, 3], Some(0)),
            terms(Some("inference"), &[0, 2, 1, 3], Some(0)),
            terms(Some("inference"), &[0, 1, 2, 3], Some(1)),
        ] {
            assert!(!unanimous(&reduce(&[
                vote(false, Some(&a)),
                vote(false, Some(&other))
            ])));
        }
        assert!(unanimous(&reduce(&[vote(false, None), vote(false, None)])));
    }

    #[test]
    fn the_verdict_names_the_first_failure_or_both_sides_of_a_disagreement() {
        let a = terms(Some("inference"), &[0, 1, 2, 3], Some(0));
        let b = terms(Some("training"), &[0, 1, 2, 3], Some(0));
        let frames = [
            Some(frame_of(0, &Status::Ok, Some(&a))),
            Some(frame_of(1, &Status::Ok, Some(&a))),
            Some(frame_of(2, &Status::Ok, Some(&b))),
        ];
        let Status::Disagree { message } = verdict(&frames) else {
            panic!("a disagreement")
        };
        assert!(
            message.starts_with(
                "ranks disagree on the workflow: rank 0 has `inference`, rank 2 has `training`"
            ),
            "{message}"
        );
        let failed = Status::Rank {
            rank: 1,
            kind: None,
            message: "no".into(),
        };
        let frames = [
            Some(frame_of(0, &Status::Ok, Some(&a))),
            Some(frame_of(1, &failed, Some(&a))),
            Some(frame_of(2, &Status::Ok, Some(&b))),
        ];
        assert_eq!(verdict(&frames), failed);
        let long = terms(None, &(0..300).collect::<Vec<_>>(), None);
        let mut shuffled: Vec<usize> = (0..300).collect();
        shuffled.swap(200, 201);
        let other = terms(None, &shuffled, None);
        // Past the ranks listed, the digest of the whole order tells them apart.
        assert_ne!(long.order, other.order);
        let Status::Disagree { message } = verdict(&[
            Some(frame_of(0, &Status::Ok, Some(&long))),
            Some(frame_of(1, &Status::Ok, Some(&other))),
        ]) else {
            panic!("a disagreement")
        };
        assert!(message.contains("the mesh's rank order"), "{message}");
        assert!(matches!(verdict(&[None]), Status::Rank { rank: 0, .. }));
    }

    #[test]
    fn any_text_goes_into_a_frame() {
        for text in [
            "\u{0}",
            "\u{fffd}\u{10ffff}",
            "a\"b\\c\n",
            &"\u{1F600}".repeat(400),
        ] {
            let s = Status::Rank {
                rank: 0,
                kind: Some(text.into()),
                message: text.into(),
            };
            let back = Status::decode(&s.encode()).expect("decodes");
            assert!(back.failed());
        }
    }

    /// Ranks whose loaders would draw different sequences (another seed) disagree on
    /// what decides the step's sample, naming both sides; the same sampler agrees.
    #[test]
    fn ranks_of_different_samplers_disagree_by_name() {
        let t = terms(None, &[0, 1, 2, 3], Some(0));
        let a = t.clone().with_sampler("seed=1 epoch=0 step=0");
        let b = t.clone().with_sampler("seed=2 epoch=0 step=0");
        assert_ne!(a.digest, b.digest);
        assert_ne!(a.digest, t.digest);
        assert!(unanimous(&reduce(&[
            vote(false, Some(&a)),
            vote(false, Some(&a.clone()))
        ])));
        assert!(!unanimous(&reduce(&[
            vote(false, Some(&a)),
            vote(false, Some(&b))
        ])));
        let frames = [
            Some(Status::Terms { rank: 0, terms: a }),
            Some(Status::Terms { rank: 1, terms: b }),
        ];
        let Status::Disagree { message } = verdict(&frames) else {
            panic!("no disagreement")
        };
        assert!(
            message.starts_with("ranks disagree on what decides the step's sample: rank 0 has `seed=1 epoch=0 step=0`, rank 1 has `seed=2 epoch=0 step=0` (every rank's loader"),
            "{message}"
        );
    }
}

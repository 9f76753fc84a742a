//! The header of one distribution step, the same bytes from every distributor (the tch
//! runtime's and the Python package's): which sample, its layout on the mesh, and what
//! every rank's buffer holds. A source sends it before the buffers; a receiver reads it
//! back checked, every slot inside the buffer, before it sizes its own.

use featshard_spec::plan::SampleLayout;
use serde::{Deserialize, Serialize};

use crate::buffer::BufferLayout;
use crate::error::ExecError;

/// What a source announces to its CP group for one sample.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// The sample's index in the serial dataset, where the source knows it.
    pub sample: Option<usize>,
    /// Padded lengths and owner-block positions of the sample on the mesh.
    pub layout: SampleLayout,
    /// Every rank's buffer: blocks first, sorted by name, then passed-through values.
    pub buffer: BufferLayout,
    /// The source writes the blocks after sending this header: receivers ready their
    /// buffers meanwhile.
    #[serde(default)]
    pub deferred: bool,
}

impl Header {
    /// The header as the bytes a source sends (JSON).
    pub fn to_bytes(&self) -> Result<Vec<u8>, ExecError> {
        serde_json::to_vec(self).map_err(|e| ExecError::Blocks {
            feature: "*".into(),
            message: format!("the header of sample {:?}: {e}", self.sample),
        })
    }

    /// A header read back from a source's bytes, every slot inside the buffer; an
    /// error saying what does not fit.
    pub fn from_bytes(bytes: &[u8]) -> Result<Header, String> {
        let header: Header =
            serde_json::from_slice(bytes).map_err(|e| format!("a step's header: {e}"))?;
        header.buffer.check()?;
        Ok(header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::Slot;
    use featshard_spec::ir::DType;

    /// A header reads back as it was sent; one whose slot lies past the buffer it
    /// announces, or whose bytes are not a header, is refused, never sized from.
    #[test]
    fn a_header_reads_back_and_a_slot_past_its_buffer_is_refused() {
        let buffer = BufferLayout::new(vec![
            Slot::new("a", DType::Float32, vec![3, 2], None),
            Slot::new("b", DType::Uint8, vec![5], None),
        ]);
        let header = Header {
            sample: Some(7),
            layout: SampleLayout {
                mesh: featshard_spec::Mesh::new(&[2, 3]).expect("mesh"),
                sizes: [("tokens".to_owned(), 5)].into(),
                padded: [("tokens".to_owned(), 6)].into(),
                positions: Default::default(),
                blocks: Default::default(),
            },
            buffer,
            deferred: true,
        };
        let bytes = header.to_bytes().expect("bytes");
        assert_eq!(Header::from_bytes(&bytes), Ok(header.clone()));
        let mut bad = header;
        bad.buffer.slots[1].offset = bad.buffer.bytes;
        let e = Header::from_bytes(&bad.to_bytes().unwrap()).unwrap_err();
        assert!(e.contains("slot `b` lies outside"), "{e}");
        let e = Header::from_bytes(b"{\"sample\": 1}").unwrap_err();
        assert!(e.starts_with("a step's header:"), "{e}");
    }
}

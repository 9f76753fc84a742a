//! A mesh in numbers: the one or two axes that split a sample ([`Mesh`]), a rank's
//! place on them ([`Coord`]), and the DP replicas in front ([`DeviceMesh`]). The plan's
//! `MeshPlan` names the axes, and reads a mesh argument for them (`MeshPlan::parse`);
//! [`Named`] is a mesh as files and messages say it (`cp=4`, `3x3 (cp0, cp1)`). Every
//! geometry function takes a [`Mesh`]; a one-axis mesh has one axis, never a second of
//! size 1.

use std::fmt;

use schemars::JsonSchema;
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::limits::MAX_RANKS;

/// Most axes a mesh splits one sample over.
pub const MAX_MESH_AXES: usize = 2;

/// The sizes of the one or two axes that split a sample, in the plan's order; at
/// least 1 each, at most [`MAX_RANKS`] ranks in all.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mesh {
    sizes: [usize; MAX_MESH_AXES],
    ndim: usize,
}

/// A rank's place on a [`Mesh`]: one index per axis.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Coord {
    at: [usize; MAX_MESH_AXES],
    ndim: usize,
}

impl Mesh {
    /// A mesh of `sizes`, one per axis: `Err` naming the fault unless there are one or
    /// two sizes, each at least 1, holding at most [`MAX_RANKS`] ranks.
    pub fn new(sizes: &[usize]) -> Result<Mesh, String> {
        if !(1..=MAX_MESH_AXES).contains(&sizes.len()) {
            return Err(format!(
                "mesh {sizes:?}: {} sizes; a mesh splits a sample over one or two axes",
                sizes.len()
            ));
        }
        crate::limits::check_mesh(sizes)?;
        let mut at = [1; MAX_MESH_AXES];
        at[..sizes.len()].copy_from_slice(sizes);
        Ok(Mesh {
            sizes: at,
            ndim: sizes.len(),
        })
    }

    /// The one-rank mesh of `ndim` axes.
    pub fn single(ndim: usize) -> Mesh {
        Mesh {
            sizes: [1; MAX_MESH_AXES],
            ndim: ndim.clamp(1, MAX_MESH_AXES),
        }
    }

    /// The size of every axis, in order.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes[..self.ndim]
    }

    /// How many axes.
    pub fn ndim(&self) -> usize {
        self.ndim
    }

    /// The size of axis `m`. Placements name only the plan's axes (checked when a
    /// plan is read and when a mesh is matched to it); an axis past them splits nothing.
    pub fn size(&self, m: usize) -> usize {
        self.sizes().get(m).copied().unwrap_or(1)
    }

    /// How many ranks: the product of the sizes.
    pub fn ranks(&self) -> usize {
        self.sizes().iter().product()
    }

    /// The coordinate of rank `rank` (row-major: the last axis varies fastest), taken
    /// modulo [`Mesh::ranks`].
    pub fn coord(&self, rank: usize) -> Coord {
        let mut at = [0; MAX_MESH_AXES];
        let mut rest = rank % self.ranks();
        for m in (0..self.ndim).rev() {
            at[m] = rest % self.sizes[m];
            rest /= self.sizes[m];
        }
        Coord {
            at,
            ndim: self.ndim,
        }
    }

    /// [`Mesh::coord`] of a rank from outside: `Err` unless it is one of the mesh's.
    pub fn checked_coord(&self, rank: usize) -> Result<Coord, String> {
        if rank >= self.ranks() {
            return Err(format!("rank {rank} is not a rank of mesh {self}"));
        }
        Ok(self.coord(rank))
    }

    /// The rank at `coord`: the inverse of [`Mesh::coord`].
    pub fn rank(&self, coord: Coord) -> usize {
        (0..self.ndim).fold(0, |r, m| r * self.sizes[m] + coord.get(m))
    }

    /// Every rank's coordinate, in rank order.
    pub fn coords(&self) -> impl Iterator<Item = Coord> + '_ {
        (0..self.ranks()).map(|r| self.coord(r))
    }

    /// A coordinate given one index per axis: `Err` unless it is on this mesh.
    pub fn coord_at(&self, at: &[usize]) -> Result<Coord, String> {
        if at.len() != self.ndim || at.iter().zip(self.sizes()).any(|(&i, &n)| i >= n) {
            return Err(format!("coordinate {at:?} is not on mesh {self}"));
        }
        let mut c = [0; MAX_MESH_AXES];
        c[..at.len()].copy_from_slice(at);
        Ok(Coord {
            at: c,
            ndim: self.ndim,
        })
    }
}

impl Coord {
    /// The index along axis `m` (0 past the mesh's axes: an axis the mesh lacks is not
    /// split).
    pub fn get(&self, m: usize) -> usize {
        self.as_slice().get(m).copied().unwrap_or(0)
    }

    /// One index per axis.
    pub fn as_slice(&self) -> &[usize] {
        &self.at[..self.ndim]
    }

    /// Whether this is the first rank of the mesh (every index 0).
    pub fn is_origin(&self) -> bool {
        self.as_slice().iter().all(|&i| i == 0)
    }
}

/// `4` or `3x3`: the sizes, axes unnamed (see [`Named`] for the plan's names).
impl fmt::Display for Mesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.sizes().iter().map(ToString::to_string).collect();
        f.write_str(&parts.join("x"))
    }
}

impl fmt::Debug for Mesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mesh({self})")
    }
}

impl fmt::Display for Coord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.as_slice().iter().map(ToString::to_string).collect();
        write!(f, "({})", parts.join(", "))
    }
}

impl fmt::Debug for Coord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Coord{self}")
    }
}

/// A mesh serializes as its list of sizes, `[4]` or `[3, 3]`.
impl Serialize for Mesh {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.sizes().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Mesh {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Mesh, D::Error> {
        let sizes = Vec::<usize>::deserialize(d)?;
        Mesh::new(&sizes).map_err(de::Error::custom)
    }
}

impl JsonSchema for Mesh {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Mesh".into()
    }

    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let mut s = Vec::<usize>::json_schema(g);
        s.insert("minItems".into(), 1.into());
        s.insert("maxItems".into(), MAX_MESH_AXES.into());
        s
    }
}

/// The DP replicas in front of a [`Mesh`]: the device mesh `(dp, cp...)`. Global rank
/// `r = d * cp.ranks() + cp.rank(coord)` sits at replica `d`, CP coordinate `coord`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceMesh {
    /// How many replicas, each of them one CP group.
    pub dp: usize,
    /// The axes one sample is split over.
    pub cp: Mesh,
}

impl DeviceMesh {
    /// `dp` replicas of `cp`: `Err` when `dp` is 0 or the world passes [`MAX_RANKS`].
    pub fn new(dp: usize, cp: Mesh) -> Result<DeviceMesh, String> {
        if dp == 0 || dp.checked_mul(cp.ranks()).is_none_or(|w| w > MAX_RANKS) {
            return Err(format!(
                "mesh dp={dp} x {cp}: the DP size must be at least 1 and the world at most {MAX_RANKS} ranks"
            ));
        }
        Ok(DeviceMesh { dp, cp })
    }

    /// Every rank of the world.
    pub fn world(&self) -> usize {
        self.dp * self.cp.ranks()
    }

    /// The replica and CP coordinate of global rank `rank`.
    pub fn position(&self, rank: usize) -> (usize, Coord) {
        let size = self.cp.ranks();
        (rank / size, self.cp.coord(rank % size))
    }

    /// The global rank of replica `d` at CP coordinate `coord`: the inverse of
    /// [`DeviceMesh::position`].
    pub fn rank(&self, d: usize, coord: Coord) -> usize {
        d * self.cp.ranks() + self.cp.rank(coord)
    }
}

/// A mesh as files and messages name it: the plan's axis names with their sizes, in
/// order. Shown as `cp=4` (one axis) or `3x3 (cp0, cp1)`; written to JSON as an object,
/// `{"cp": 4}`.
#[derive(Clone, PartialEq, Eq)]
pub struct Named(pub Vec<(String, usize)>);

/// `1 size`, `3 sizes`.
pub fn sizes_text(n: usize) -> String {
    match n {
        1 => "1 size".to_owned(),
        n => format!("{n} sizes"),
    }
}

impl Named {
    /// How many ranks: the product of the sizes.
    pub fn ranks(&self) -> usize {
        self.0.iter().map(|&(_, n)| n).product()
    }
}

impl fmt::Display for Named {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_slice() {
            [(name, n)] => write!(f, "{name}={n}"),
            axes => {
                let sizes: Vec<String> = axes.iter().map(|(_, n)| n.to_string()).collect();
                let names: Vec<&str> = axes.iter().map(|(a, _)| a.as_str()).collect();
                write!(f, "{} ({})", sizes.join("x"), names.join(", "))
            }
        }
    }
}

impl fmt::Debug for Named {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl Serialize for Named {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (name, n) in &self.0 {
            map.serialize_entry(name, n)?;
        }
        map.end()
    }
}

/// Read in document order. A list of sizes (files written before meshes were named,
/// `[4, 1]` for a one-axis mesh) is refused by name.
impl<'de> Deserialize<'de> for Named {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Named, D::Error> {
        struct Axes;
        impl<'de> Visitor<'de> for Axes {
            type Value = Named;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mesh as an object of axis names and sizes, {\"cp\": 4}")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Named, A::Error> {
                let mut axes = Vec::new();
                while let Some(entry) = map.next_entry::<String, usize>()? {
                    if axes.len() == MAX_MESH_AXES {
                        return Err(de::Error::custom("a mesh of more than two axes"));
                    }
                    axes.push(entry);
                }
                Ok(Named(axes))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Named, A::Error> {
                Err(de::Error::custom(
                    "a mesh given as a list of sizes, as featshard wrote before it named mesh axes; shard the samples again",
                ))
            }
        }
        d.deserialize_any(Axes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coords_are_row_major_and_invert() {
        for sizes in [&[1][..], &[4], &[3, 3], &[2, 3], &[5, 1]] {
            let mesh = Mesh::new(sizes).unwrap();
            let coords: Vec<Coord> = mesh.coords().collect();
            assert_eq!(coords.len(), mesh.ranks());
            for (r, c) in coords.iter().enumerate() {
                assert_eq!(mesh.rank(*c), r);
                assert_eq!(c.as_slice().len(), sizes.len());
                assert_eq!(mesh.coord_at(c.as_slice()).unwrap(), *c);
            }
        }
        let tile = Mesh::new(&[2, 3]).unwrap();
        assert_eq!(tile.coord(4).as_slice(), &[1, 1]);
        assert!(tile.checked_coord(6).is_err());
        assert!(tile.coord_at(&[2, 0]).is_err());
        assert!(tile.coord_at(&[1]).is_err());
    }

    #[test]
    fn one_axis_has_one_size() {
        let axis = Mesh::new(&[4]).unwrap();
        assert_eq!(axis.sizes(), &[4]);
        assert_eq!(axis.to_string(), "4");
        assert_ne!(axis, Mesh::new(&[4, 1]).unwrap());
        assert_eq!(serde_json::to_string(&axis).unwrap(), "[4]");
    }

    #[test]
    fn refuses_bad_sizes() {
        assert!(Mesh::new(&[]).is_err());
        assert!(Mesh::new(&[2, 2, 2]).is_err());
        assert!(Mesh::new(&[0]).is_err());
        assert!(Mesh::new(&[MAX_RANKS, 2]).is_err());
        assert!(DeviceMesh::new(0, Mesh::single(1)).is_err());
        assert!(DeviceMesh::new(MAX_RANKS, Mesh::new(&[2]).unwrap()).is_err());
    }

    #[test]
    fn device_mesh_positions_invert() {
        let m = DeviceMesh::new(2, Mesh::new(&[2, 3]).unwrap()).unwrap();
        for r in 0..m.world() {
            let (d, c) = m.position(r);
            assert_eq!(m.rank(d, c), r);
        }
        assert_eq!(m.position(7).0, 1);
        assert_eq!(m.position(7).1.as_slice(), &[0, 1]);
    }

    #[test]
    fn named_round_trips_and_refuses_sizes() {
        let n = Named(vec![("cp".into(), 4)]);
        assert_eq!(n.to_string(), "cp=4");
        let json = serde_json::to_string(&n).unwrap();
        assert_eq!(json, r#"{"cp":4}"#);
        assert_eq!(serde_json::from_str::<Named>(&json).unwrap(), n);
        let t = Named(vec![("cp0".into(), 3), ("cp1".into(), 2)]);
        assert_eq!(t.to_string(), "3x2 (cp0, cp1)");
        let back: Named = serde_json::from_str(r#"{"cp0":3,"cp1":2}"#).unwrap();
        assert_eq!(back, t);
        let old = serde_json::from_str::<Named>("[4, 1]")
            .unwrap_err()
            .to_string();
        assert!(old.contains("before it named mesh axes"), "{old}");
    }
}

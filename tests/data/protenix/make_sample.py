"""Makes small_complex.safetensors with Protenix 2.0.0's own inference featurizer, run
offline (see README.md for the environment).

    python make_sample.py ccd ROOT/common          # the CCD cut from biotite's copy
    python make_sample.py featurize OUT_DIR        # the sample, with PROTENIX_ROOT_DIR=ROOT

The featurizer's output is saved as it comes: every tensor in its own dtype, the nested
`constraint_feature` dict flattened to `constraint_feature.<key>` (`.` joins a path).
"""

import json
import sys
from pathlib import Path

# Every component the sample uses.
CODES = "ALA,ARG,GLN,ILE,LYS,MET,THR,TYR,UNK,ZN,ATP,DA,DG"

SAMPLE = {
    "name": "small_complex",
    "sequences": [
        {"proteinChain": {"sequence": "MKTAYIAKQRQI", "count": 1}},
        {"ligand": {"ligand": "CCD_ATP", "count": 1}},
        {"ion": {"ion": "ZN", "count": 1}},
        {"dnaSequence": {"sequence": "GA", "count": 1}},
    ],
}


def cut_ccd(out: Path) -> None:
    """biotite ships the CCD as one BinaryCIF block with every component's rows
    together: written here one block per component, as the wwPDB file has them."""
    import biotite.structure.io.pdbx as pdbx
    from biotite.structure.info.ccd import get_ccd

    ccd = get_ccd()
    key = {"chem_comp": "id", "chem_comp_atom": "comp_id", "chem_comp_bond": "comp_id"}
    cols = {c: {k: ccd[c][k].as_array(str) for k in ccd[c].keys()} for c in key}
    cif = pdbx.CIFFile()
    for code in CODES.split(","):
        block = pdbx.CIFBlock()
        for cat, col in key.items():
            rows = cols[cat][col] == code
            if rows.any():
                block[cat] = pdbx.CIFCategory({k: v[rows] for k, v in cols[cat].items()})
        cif[code] = block
    out.mkdir(parents=True, exist_ok=True)
    cif.write(str(out / "components.cif"))


def featurize(out: Path) -> None:
    import torch
    from protenix.data.inference.json_to_feature import SampleDictToFeatures
    from protenix.data.utils import data_type_transform, make_dummy_feature
    from safetensors.torch import save_file

    # What InferenceDataset.process_one does with MSA, templates and ESM off.
    feats, atom_array, _ = SampleDictToFeatures(SAMPLE).get_feature_dict()
    feats["distogram_rep_atom_mask"] = torch.Tensor(atom_array.distogram_rep_atom_mask).long()
    feats = make_dummy_feature(features_dict=feats, dummy_feats=["template", "msa"])
    feats = data_type_transform(feat_or_label_dict=feats)
    flat, inventory = {}, {}

    def walk(d: dict, path: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v, f"{path}{k}.")
            else:
                flat[path + k] = v.contiguous()
                inventory[path + k] = {"shape": list(v.shape), "dtype": str(v.dtype)[6:]}

    walk(feats, "")
    save_file(flat, str(out / "small_complex.safetensors"))
    (out / "small_complex.json").write_text(json.dumps(inventory, indent=1, sort_keys=True))


if __name__ == "__main__":
    {"ccd": cut_ccd, "featurize": featurize}[sys.argv[1]](Path(sys.argv[2]))

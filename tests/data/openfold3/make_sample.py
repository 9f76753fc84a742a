"""Makes the OpenFold3 test samples with OpenFold3 0.5.0's own inference featurizer.

Usage (see README.md for the environment):
    PYTHONPATH=DEPS:OPENFOLD3 python make_sample.py OUT_DIR

Writes three forms of one sample, each as OpenFold3's data pipeline hands it on:
`plain` (`InferenceDataset[0]`), `padded` (the same query featurized to a token budget,
as its training datasets pad) and `collated` (row 0 of `openfold_batch_collator` over
the padded sample and a larger one, as a training batch holds it).
"""

import json
import os
import sys
import tempfile

import torch
from safetensors.torch import save_file

from openfold3.core.data.framework.data_module import openfold_batch_collator
from openfold3.core.data.framework.single_datasets import inference as of3_inference
from openfold3.core.data.framework.single_datasets.inference import InferenceDataset
from openfold3.projects.of3_all_atom.config.dataset_configs import InferenceJobConfig

PROTEIN = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQAPILSRV"
BUDGET = 80
# A 5-row MSA of the protein: the query and four variants (point substitutions).
MSA_ROWS = [PROTEIN] + [
    PROTEIN[:i] + "A" + PROTEIN[i + 1 :] for i in (3, 11, 19, 27)
]


def query(name: str, ions: int, msa_dir: str) -> dict:
    chains = [
        {
            "molecule_type": "protein",
            "chain_ids": ["A"],
            "sequence": PROTEIN,
            "main_msa_file_paths": [msa_dir],
        },
        {"molecule_type": "ligand", "chain_ids": ["B"], "ccd_codes": ["ATP"]},
    ] + [
        {"molecule_type": "ligand", "chain_ids": [chr(ord("C") + i)], "ccd_codes": ["MG"]}
        for i in range(ions)
    ]
    return {
        "query_name": name,
        "chains": chains,
        "use_paired_msas": False,
        "pocket_constraint": {
            "ligand_chain_id": "B",
            "pocket_residues": [["A", 10], ["A", 14]],
        },
    }


def dataset(msa_dir: str, ions: int) -> InferenceDataset:
    config = InferenceJobConfig.model_validate(
        {
            "query_set": {
                "seeds": [7],
                "queries": {"q": query("q", ions, msa_dir)},
            },
            "seeds": [7],
            "template": {"n_templates": 1},
            "template_preprocessor_settings": {},
        }
    )
    return InferenceDataset(config, world_size=1)


def featurize(msa_dir: str, ions: int, budget: int | None) -> dict:
    """`InferenceDataset[0]`, its token axis padded to `budget` where one is given."""
    count = of3_inference.get_token_count
    if budget is not None:
        of3_inference.get_token_count = lambda _: budget
    try:
        features = dataset(msa_dir, ions)[0]
    finally:
        of3_inference.get_token_count = count
    if not features["valid_sample"].item():
        raise SystemExit("the featurizer failed on the query: see its log above")
    return {k: v for k, v in features.items() if isinstance(v, torch.Tensor)}


def flat(features: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in features.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value.contiguous()
    return out


def save(out_dir: str, name: str, features: dict) -> None:
    tensors = flat(features)
    save_file(tensors, os.path.join(out_dir, f"{name}.safetensors"))
    listing = {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in tensors.items()}
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(listing, f, indent=1, sort_keys=True)
        f.write("\n")


def main() -> None:
    out_dir = sys.argv[1]
    with tempfile.TemporaryDirectory() as msa_dir:
        with open(os.path.join(msa_dir, "uniref90_hits.a3m"), "w") as f:
            for i, row in enumerate(MSA_ROWS):
                f.write(f">row{i}\n{row}\n")
        plain = featurize(msa_dir, ions=1, budget=None)
        padded = featurize(msa_dir, ions=1, budget=BUDGET)
        larger = featurize(msa_dir, ions=3, budget=BUDGET)
    save(out_dir, "plain", plain)
    save(out_dir, "padded", padded)
    batch = openfold_batch_collator([dict(padded), dict(larger)])
    save(out_dir, "collated", {k: v[0] for k, v in batch.items() if isinstance(v, torch.Tensor)})


if __name__ == "__main__":
    main()

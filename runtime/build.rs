//! Two jobs: put libtorch on the rpath (tch does not), and compile the c10d shim
//! (`csrc/c10d_shim.cpp`) against the same libtorch that tch links.

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let Ok(lib) = env::var("DEP_TCH_LIBTORCH_LIB") else {
        return;
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    if env::var_os("CARGO_FEATURE_C10D").is_some() {
        shim(Path::new(&lib));
    }
}

fn shim(lib: &Path) {
    println!("cargo:rerun-if-changed=csrc/c10d_shim.cpp");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    println!("cargo:rerun-if-env-changed=FEATSHARD_GLOO_INCLUDE");
    let torch_include = lib.parent().map(|p| p.join("include")).unwrap_or_default();
    // ProcessGroupGloo.hpp includes gloo's headers, which the PyTorch wheel does not ship.
    let gloo_include = env::var_os("FEATSHARD_GLOO_INCLUDE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/include"));
    if !gloo_include.join("gloo/config.h").exists() {
        panic!(
            "featshard-runtime's c10d feature needs gloo's headers: {} has no gloo/config.h. \
             Install them (Debian/Ubuntu: `apt-get install -y libgloo-dev`), point \
             FEATSHARD_GLOO_INCLUDE at their parent folder, or build without the `c10d` feature.",
            gloo_include.display()
        );
    }
    let abi = env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".to_owned());
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .warnings(false)
        .std("c++17")
        .include(&torch_include)
        .include(torch_include.join("torch/csrc/api/include"))
        .include(&gloo_include)
        .define("USE_C10D_GLOO", None)
        .define("GLOG_USE_GLOG_EXPORT", None)
        .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
        .file("csrc/c10d_shim.cpp");
    if env::var_os("CARGO_FEATURE_NCCL").is_some() {
        for dir in cuda_includes(lib) {
            build.include(dir);
        }
        build.define("USE_C10D_NCCL", None);
        println!("cargo:rustc-link-lib=c10_cuda");
        println!("cargo:rustc-link-lib=torch_cuda");
    }
    build.compile("featshard_c10d");
}

/// CUDA and NCCL headers from the pip `nvidia-*` packages installed beside torch
/// (`site-packages/nvidia/{cu13,nccl}/include`), or `CUDA_HOME/include`.
fn cuda_includes(lib: &Path) -> Vec<PathBuf> {
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    let mut dirs = Vec::new();
    if let Some(home) = env::var_os("CUDA_HOME") {
        dirs.push(PathBuf::from(home).join("include"));
    }
    // lib = site-packages/torch/lib
    if let Some(site) = lib.parent().and_then(Path::parent) {
        let nvidia = site.join("nvidia");
        if let Ok(entries) = std::fs::read_dir(&nvidia) {
            let mut found: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path().join("include")))
                .filter(|p| p.is_dir())
                .collect();
            found.sort();
            dirs.extend(found);
        }
    }
    if !dirs.iter().any(|d| d.join("cuda_runtime_api.h").exists()) {
        panic!(
            "the `nccl` feature needs CUDA headers: none of {dirs:?} has cuda_runtime_api.h; \
             `pip install nvidia-cuda-crt==13.0.* nvidia-cuda-cccl==13.0.*` beside torch or set CUDA_HOME"
        );
    }
    dirs
}

//! The `featshard` command line, as a function: the `featshard` binary calls it, and so
//! does the Python package's `featshard` command (in process, through its native
//! module), so both take the same arguments and say the same things.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::commands::{self, Failure};
use crate::explain;

/// One YAML spec for every context-parallel feature placement, padding plan and
/// generated module.
#[derive(Parser)]
#[command(name = "featshard", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write <module>.py, .pyi, <module>_data.py, <module>.rs and <module>.plan.json into DIR.
    Generate {
        spec: PathBuf,
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Also write test_<module>_parity.py, a pytest parity test under torch.distributed.
        #[arg(long)]
        tests: bool,
    },
    /// Exit 1 naming every generated file in DIR that is missing or stale.
    Check {
        spec: PathBuf,
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Validate a spec and print a summary; with --features, check it against samples:
    /// every declaration their values contradict, and whether featshard takes them.
    Validate {
        spec: PathBuf,
        /// Serial samples (safetensors) to check the spec against; exit 1 on any finding.
        #[arg(long, value_name = "FILE", num_args = 1..)]
        features: Vec<PathBuf>,
        /// The samples' workflow: only its features are required.
        #[arg(long)]
        workflow: Option<String>,
        /// `text` for people, or `json`: one document on stdout (its schema:
        /// `featshard schema --report validate`), the exit code the same.
        #[arg(long, default_value = "text", value_parser = ["text", "json"])]
        format: String,
    },
    /// Print every feature's placement, padded global shape and local shape on a mesh.
    Explain {
        spec: PathBuf,
        /// Mesh sizes, one per axis of the spec's mesh: 3x3 or 2x3 for (cp0, cp1), 8 for (cp,).
        #[arg(long, value_parser = commands::parse_mesh)]
        mesh: commands::MeshArg,
        /// Run-time lengths, e.g. tokens=2048,atoms=20000,msa=4096.
        #[arg(long, value_parser = parse_lengths)]
        lengths: Option<LengthArg>,
        /// Only the features of this workflow.
        #[arg(long)]
        workflow: Option<String>,
        /// Draw this feature's tiles on the mesh instead of the table.
        #[arg(long)]
        feature: Option<String>,
        /// Write the picture(s) as SVG: the named feature, or every feature.
        #[arg(long, value_name = "FILE")]
        svg: Option<PathBuf>,
    },
    /// Shard one serial sample (safetensors) into DIR/rank-<r>.safetensors + manifest.json,
    /// or a dataset of them into DIR/<sample>/ + DIR/dataset.json.
    Shard {
        spec: PathBuf,
        /// The serial sample, a safetensors file of feature name -> tensor; or a dataset:
        /// a folder of them, a glob pattern, or @LIST (a file of paths, one per line).
        #[arg(long, value_name = "FILE|DIR|GLOB|@LIST")]
        features: String,
        /// Datasets: samples sharded at a time.
        #[arg(long, default_value_t = 1)]
        jobs: usize,
        /// Threads of each job, or of the one sample, sharing its rank files.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Mesh sizes, one per axis of the spec's mesh: 3x3 or 2x3 for (cp0, cp1), 8 for (cp,).
        #[arg(long, value_parser = commands::parse_mesh)]
        mesh: commands::MeshArg,
        /// Only the features of this workflow.
        #[arg(long)]
        workflow: Option<String>,
        /// Tensors not in the spec to carry along untouched (comma-separated).
        #[arg(long, value_delimiter = ',')]
        passthrough: Vec<String>,
        /// Refuse a sample whose rank files would be over this many times its bytes
        /// (and over 1 GB): a guard against a mistyped mesh.
        #[arg(long, default_value_t = crate::room::MAX_GROWTH, value_name = "RATIO", value_parser = crate::room::parse_growth)]
        max_growth: f64,
        /// How rank files store features with a compact form: `compact` (one-hot features
        /// as indices, masks as bits, sparse features as entries, ranged ones narrowed:
        /// a tenth to a thirtieth of the bytes; featshard's readers expand them) or
        /// `dense` (the blocks as the model takes them, for any safetensors reader).
        #[arg(long, default_value = "compact", value_name = "ENCODING", value_parser = parse_encoding)]
        encoding: featshard_spec::shards::Encoding,
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Assemble DIR's rank files back into one sample (serial, or --padded).
    Assemble {
        spec: PathBuf,
        #[arg(long, value_name = "DIR")]
        shards: PathBuf,
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// Keep the padded global layout instead of un-padding.
        #[arg(long)]
        padded: bool,
        /// Skip the check of each rank file's CRC-32 against the manifest (one more
        /// read of every byte; on by default).
        #[arg(long)]
        no_verify: bool,
    },
    /// Draft a spec from one serial sample (safetensors), proposing axis semantics by
    /// matching lengths against anchor features; ambiguities are left as QUESTION(...).
    Init(InitArgs),
    /// Print the JSON Schema (draft-07) of spec files, for editor completion.
    Schema {
        /// The schema of plan.json instead.
        #[arg(long)]
        plan: bool,
        /// The schema of a command's JSON report instead: `validate`.
        #[arg(long, value_name = "COMMAND", value_parser = ["validate"])]
        report: Option<String>,
    },
}

/// `featshard init`'s arguments.
#[derive(clap::Args)]
struct InitArgs {
    /// The serial sample.
    #[arg(long, value_name = "FILE")]
    from: PathBuf,
    /// Feature whose axis 0 counts tokens.
    #[arg(long, value_name = "KEY")]
    tokens: Option<String>,
    /// Feature whose axis 0 counts atoms.
    #[arg(long, value_name = "KEY")]
    atoms: Option<String>,
    /// Feature whose axis 0 counts MSA rows.
    #[arg(long, value_name = "KEY")]
    msa: Option<String>,
    /// Feature whose axis 0 counts R-set rows.
    #[arg(long, value_name = "KEY")]
    rset: Option<String>,
    /// Feature whose axis 0 counts ensemble members.
    #[arg(long, value_name = "KEY")]
    ensemble: Option<String>,
    /// Feature whose axis 0 counts templates.
    #[arg(long, value_name = "KEY")]
    templates: Option<String>,
    /// Module name of the draft.
    #[arg(long, default_value = "features")]
    module: String,
    /// Write the draft here instead of printing it.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

/// `--lengths` as one value (clap would read a `Vec` as repeated values).
#[derive(Clone)]
struct LengthArg(Vec<(String, usize)>);

fn parse_lengths(s: &str) -> Result<LengthArg, String> {
    commands::parse_lengths(s).map(LengthArg)
}

/// `featshard shard`'s run-time arguments.
fn shard(
    spec: &std::path::Path,
    features: &str,
    run: &crate::shards::Run,
    out: &std::path::Path,
) -> Result<String, Failure> {
    if crate::dataset::is_dataset(features) {
        return crate::dataset::shard_dataset(spec, features, run, out);
    }
    crate::shards::shard(spec, std::path::Path::new(features), run, out)
}

fn assemble(
    spec: &std::path::Path,
    shards: &std::path::Path,
    out: &std::path::Path,
    padded: bool,
    verify: bool,
) -> Result<String, Failure> {
    crate::assemble::assemble_files(spec, shards, out, padded, verify)
}

/// How `explain` shows its result: an SVG file, a terminal picture of one feature (in
/// colour only on a terminal, and never with NO_COLOR set), or the table.
fn explain_view<'a>(
    svg: Option<&'a std::path::Path>,
    feature: Option<&'a str>,
) -> explain::View<'a> {
    match (svg, feature) {
        (Some(file), feature) => explain::View::Svg { feature, file },
        (None, Some(feature)) => explain::View::Picture {
            feature,
            color: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        },
        (None, None) => explain::View::Table,
    }
}

/// `text` written to `out` (then a line saying so), or returned to be printed.
fn write_or_print(text: String, out: Option<PathBuf>) -> Result<String, Failure> {
    match out {
        Some(path) => std::fs::write(&path, &text)
            .map(|()| format!("wrote {}", path.display()))
            .map_err(|e| Failure::Other(format!("cannot write {}: {e}", path.display()))),
        None => Ok(text),
    }
}

/// One `wrote PATH` line per file written.
fn wrote(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| format!("wrote {}", p.display()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `init`'s anchors: the sample key given for each semantic that was named.
fn anchors(given: [(&str, Option<String>); 6]) -> crate::init::Anchors {
    given
        .into_iter()
        .filter_map(|(s, k)| k.map(|k| (s.to_owned(), k)))
        .collect()
}

/// `featshard init`: the draft, written or printed.
fn run_init(args: InitArgs) -> Result<String, Failure> {
    let InitArgs {
        from,
        tokens,
        atoms,
        msa,
        rset,
        ensemble,
        templates,
        module,
        out,
    } = args;
    let anchors = anchors([
        ("tokens", tokens),
        ("atoms", atoms),
        ("msa", msa),
        ("rset", rset),
        ("ensemble", ensemble),
        ("templates", templates),
    ]);
    crate::init::draft(&from, &anchors, &module).and_then(|text| write_or_print(text, out))
}

/// Runs one parsed command.
fn dispatch(command: Command) -> Result<String, Failure> {
    match command {
        Command::Generate { spec, out, tests } => {
            commands::generate(&spec, &out, tests).map(|written| wrote(&written))
        }
        Command::Check { spec, out } => commands::check(&spec, &out),
        Command::Validate {
            spec,
            features,
            workflow,
            format,
        } => match format.as_str() {
            "json" => crate::report::validate_json(&spec, &features, workflow.as_deref()),
            _ => commands::validate(&spec, &features, workflow.as_deref()),
        },
        Command::Explain {
            spec,
            mesh,
            lengths,
            workflow,
            feature,
            svg,
        } => {
            let view = explain_view(svg.as_deref(), feature.as_deref());
            explain::explain(
                &spec,
                &mesh,
                lengths.as_ref().map(|l| l.0.as_slice()),
                workflow.as_deref(),
                view,
            )
        }
        Command::Schema { plan, report } => Ok(match report {
            Some(_) => crate::report::validate_schema(),
            None => commands::schema(plan),
        }),
        Command::Init(args) => run_init(args),
        Command::Shard {
            spec,
            features,
            jobs,
            threads,
            mesh,
            workflow,
            passthrough,
            max_growth,
            encoding,
            out,
        } => shard(
            &spec,
            &features,
            &crate::shards::Run {
                mesh,
                workflow: workflow.as_deref(),
                passthrough: &passthrough,
                jobs,
                threads,
                max_growth,
                encoding,
            },
            &out,
        ),
        Command::Assemble {
            spec,
            shards,
            out,
            padded,
            no_verify,
        } => assemble(&spec, &shards, &out, padded, !no_verify),
    }
}

fn parse_encoding(s: &str) -> Result<featshard_spec::shards::Encoding, String> {
    use featshard_spec::shards::Encoding;
    [Encoding::Compact, Encoding::Dense]
        .into_iter()
        .find(|e| e.name() == s)
        .ok_or_else(|| format!("encoding `{s}`: expected `compact` or `dense`"))
}

/// Runs the command line `args` (the program name first) and returns its exit status:
/// 0 on success, 1 when the command failed, 2 for arguments it cannot parse. Output
/// goes to stdout and stderr; nothing here exits the process.
pub fn run(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> i32 {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are "errors" that print to stdout and succeed.
            let _ = e.print();
            return e.exit_code();
        }
    };
    report(dispatch(cli.command))
}

/// Prints a command's result and gives its exit status.
fn report(result: Result<String, Failure>) -> i32 {
    match result {
        Ok(text) => {
            println!("{}", text.trim_end());
            0
        }
        Err(Failure::Spec(d)) => {
            eprintln!("{:?}", miette::Report::new(d));
            1
        }
        Err(Failure::Findings(text)) => {
            println!("{}", text.trim_end());
            1
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

//! `domaind kubelet-sim`: the kubelet's calls to a DRA plugin, from the command line.

use anyhow::{Context, bail};
use domaind_actors::model::ClaimRef;
use domaind_kubelet_plugin::client::{self, ClaimAnswer, KubeletClient};
use serde_json::{Value, json};

use crate::cli::{ClaimCallArgs, KubeletSimCommand};

pub fn run(command: KubeletSimCommand) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        match command {
            KubeletSimCommand::Register { registry_socket } => {
                let registration = client::register(&registry_socket).await?;
                print(&json!({
                    "driver": registration.driver_name,
                    "endpoint": registration.endpoint,
                    "supportedVersions": registration.supported_versions,
                    "preferredVersion": registration.preferred_version().as_str(),
                }))
            }
            KubeletSimCommand::Prepare(args) => {
                let kubelet = KubeletClient::connect(&args.socket).await?;
                let answers = kubelet.prepare(&args.claims, args.version).await?;
                let failed = count_failed(&answers);
                let claims = answers.into_iter().map(|answer| {
                    claim_json(answer, |devices| {
                        let devices: Vec<Value> = devices
                            .into_iter()
                            .map(|device| {
                                json!({
                                    "requestNames": device.request_names,
                                    "poolName": device.pool_name,
                                    "deviceName": device.device_name,
                                    "cdiDeviceIds": device.cdi_device_ids,
                                })
                            })
                            .collect();
                        ("devices", Value::from(devices))
                    })
                });
                finish(&args, claims.collect(), failed)
            }
            KubeletSimCommand::Unprepare(args) => {
                let kubelet = KubeletClient::connect(&args.socket).await?;
                let answers = kubelet.unprepare(&args.claims, args.version).await?;
                let failed = count_failed(&answers);
                let claims = answers
                    .into_iter()
                    .map(|answer| claim_json(answer, |()| ("unprepared", Value::Bool(true))));
                finish(&args, claims.collect(), failed)
            }
        }
    })
}

fn count_failed<T>(answers: &[ClaimAnswer<T>]) -> usize {
    answers.iter().filter(|a| a.result.is_err()).count()
}

/// `{uid, namespace, name}` plus either what succeeded gave or `error`.
fn claim_json<T>(answer: ClaimAnswer<T>, ok: impl FnOnce(T) -> (&'static str, Value)) -> Value {
    let ClaimRef {
        uid,
        namespace,
        name,
    } = answer.claim;
    let mut entry = json!({ "uid": uid, "namespace": namespace, "name": name });
    let (key, value) = match answer.result {
        Ok(result) => ok(result),
        Err(error) => ("error", Value::String(error)),
    };
    entry[key] = value;
    entry
}

fn finish(args: &ClaimCallArgs, claims: Vec<Value>, failed: usize) -> anyhow::Result<()> {
    let total = claims.len();
    print(&json!({ "version": args.version.as_str(), "claims": claims }))?;
    if failed > 0 {
        bail!("{failed} of {total} claim(s) failed (see \"error\" in the output)");
    }
    Ok(())
}

fn print(value: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

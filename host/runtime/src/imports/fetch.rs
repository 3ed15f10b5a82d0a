//! `inlay:policy/fetch`: subrequests to configured backends through the
//! host's fetcher. `send-many` hands the whole batch to
//! [`PolicyServices::fetch_many`](crate::PolicyServices::fetch_many), which
//! runs it in parallel.

use std::time::Instant;

use bytes::Bytes;
use http::Method;
use tracing::Instrument;

use crate::bindings::inlay::policy::fetch::{FetchError, FetchRequest, FetchResponse, Host};
use crate::convert::{headers_from_list, headers_to_list, parse_path_and_query};
use crate::policy::state::StoreState;
use crate::services::{self, BodyBudget, SubRequest};

/// Validates a guest's subrequest and turns it into the host's type.
fn to_sub_request(
    req: FetchRequest,
    backend_exists: impl Fn(&str) -> bool,
    body_budget: &BodyBudget,
    parent_headers: &http::HeaderMap,
) -> Result<SubRequest, FetchError> {
    if let Some(backend) = &req.backend
        && !backend_exists(backend)
    {
        return Err(FetchError::UnknownBackend(backend.clone()));
    }
    let method = if req.method.is_empty() {
        Method::GET
    } else {
        Method::from_bytes(req.method.as_bytes())
            .map_err(|_| FetchError::InvalidRequest(format!("invalid method {:?}", req.method)))?
    };
    let uri = parse_path_and_query(&req.url).map_err(FetchError::InvalidRequest)?;
    let headers = headers_from_list(req.headers).map_err(FetchError::InvalidRequest)?;
    Ok(SubRequest {
        backend: req.backend,
        method,
        uri,
        headers,
        body: Bytes::from(req.body),
        body_budget: body_budget.clone(),
        parent_headers: parent_headers.clone(),
    })
}

fn from_sub_response(
    result: Result<services::SubResponse, services::FetchError>,
) -> Result<FetchResponse, FetchError> {
    match result {
        Ok(resp) => Ok(FetchResponse {
            status: resp.status.as_u16(),
            headers: headers_to_list(&resp.headers),
            body: resp.body.to_vec(),
        }),
        Err(e) => Err(match e {
            services::FetchError::UnknownBackend(b) => FetchError::UnknownBackend(b),
            services::FetchError::InvalidRequest(m) => FetchError::InvalidRequest(m),
            services::FetchError::ConnectFailed(m) => FetchError::ConnectFailed(m),
            services::FetchError::Timeout => FetchError::Timeout,
            services::FetchError::BodyTooLarge => FetchError::BodyTooLarge,
        }),
    }
}

impl Host for StoreState {
    async fn send(
        &mut self,
        req: FetchRequest,
    ) -> wasmtime::Result<Result<FetchResponse, FetchError>> {
        let span = tracing::debug_span!("hostcall", call = "fetch.send", url = %req.url);
        if !self.count_unrepeatable() || self.take_subrequests(1) == 0 {
            return Ok(Err(FetchError::LimitExceeded));
        }
        let services = self.services();
        let parent = self.current_headers();
        let sub = match to_sub_request(
            req,
            |b| services.backend_exists(b),
            &self.subrequest_bytes,
            &parent,
        ) {
            Ok(sub) => sub,
            Err(e) => return Ok(Err(e)),
        };
        let future = self.services().fetch(sub, &self.default_backend());
        self.clock.host_call_starts();
        let started = Instant::now();
        let result = self.bounded(future.instrument(span)).await;
        // Waiting for the backend is not the guest's CPU time.
        self.clock.exclude(started.elapsed());
        Ok(from_sub_response(
            result.unwrap_or(Err(services::FetchError::Timeout)),
        ))
    }

    async fn send_many(
        &mut self,
        reqs: Vec<FetchRequest>,
    ) -> wasmtime::Result<Vec<Result<FetchResponse, FetchError>>> {
        let span = tracing::debug_span!("hostcall", call = "fetch.send-many", count = reqs.len());
        if !self.count_unrepeatable() {
            return Ok(reqs
                .iter()
                .map(|_| Err(FetchError::LimitExceeded))
                .collect());
        }
        // The first requests that fit under the cap go out; the rest are
        // refused one by one, so the guest sees exactly which were sent.
        let granted = self.take_subrequests(reqs.len());
        let mut results: Vec<Option<Result<FetchResponse, FetchError>>> =
            Vec::with_capacity(reqs.len());
        let mut batch = Vec::new();
        let mut slots = Vec::new();
        let services = self.services();
        let parent = self.current_headers();
        for (i, req) in reqs.into_iter().enumerate() {
            if i >= granted {
                results.push(Some(Err(FetchError::LimitExceeded)));
                continue;
            }
            match to_sub_request(
                req,
                |b| services.backend_exists(b),
                &self.subrequest_bytes,
                &parent,
            ) {
                Ok(sub) => {
                    batch.push(sub);
                    slots.push(i);
                    results.push(None);
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        if !batch.is_empty() {
            let sent = batch.len();
            let future = self.services().fetch_many(batch, &self.default_backend());
            self.clock.host_call_starts();
            let started = Instant::now();
            let answers = self
                .bounded(future.instrument(span))
                .await
                .unwrap_or_else(|| {
                    (0..sent)
                        .map(|_| Err(services::FetchError::Timeout))
                        .collect()
                });
            self.clock.exclude(started.elapsed());
            if answers.len() != sent {
                // A host bug: the guest cannot be given a consistent answer.
                wasmtime::bail!(
                    "fetch_many returned {} results for {sent} requests",
                    answers.len()
                );
            }
            for (slot, answer) in slots.into_iter().zip(answers) {
                if let Some(entry) = results.get_mut(slot) {
                    *entry = Some(from_sub_response(answer));
                }
            }
        }
        Ok(results
            .into_iter()
            .map(|r| r.unwrap_or(Err(FetchError::LimitExceeded)))
            .collect())
    }
}

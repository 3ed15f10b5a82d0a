//! A `wasi:http/service` 0.3 component: `handle` is an async function and
//! the body a stream, written after the response is returned.

wit_bindgen::generate!({
    path: "../wit-p3",
    world: "inlay:components-p3/service",
    generate_all,
});

use exports::wasi::http::handler::Guest;
use wasi::http::types::{ErrorCode, Fields, Request, Response};

struct App;

export!(App);

impl Guest for App {
    async fn handle(request: Request) -> Result<Response, ErrorCode> {
        let pq = request.get_path_with_query().unwrap_or_else(|| "/".into());
        let (status, cc, body): (u16, &str, &[u8]) = match pq.split('?').next().unwrap_or("/") {
            "/" => (200, "max-age=60", b"<html><body><h1>Rust 0.3 component</h1>\n<esi:include src=\"/fragment\"/>\n</body></html>\n"),
            "/fragment" => (200, "max-age=60", b"<p>fragment from a Rust 0.3 component</p>"),
            "/hello" => (200, "max-age=60", b"hello from a Rust 0.3 component\n"),
            _ => (404, "no-store", b"not found\n"),
        };
        let mut fields: Vec<(String, Vec<u8>)> = vec![
            ("content-type".into(), b"text/html".to_vec()),
            ("cache-control".into(), cc.as_bytes().to_vec()),
        ];
        if pq == "/" {
            fields.push(("surrogate-control".into(), b"content=\"ESI/1.0\"".to_vec()));
        }
        let headers = Fields::from_list(&fields).map_err(|_| ErrorCode::InternalError(None))?;
        let (mut tx, rx) = wit_stream::new();
        let (trailers_tx, trailers_rx) = wit_future::new(|| Ok(None));
        let (response, _sent) = Response::new(headers, Some(rx), trailers_rx);
        let _ = response.set_status_code(status);
        let body = body.to_vec();
        wit_bindgen::spawn_local(async move {
            let _ = tx.write_all(body).await;
            drop(tx);
            let _ = trailers_tx.write(Ok(None)).await;
        });
        Ok(response)
    }
}

// A wasi:http/proxy 0.2 component in JavaScript (ComponentizeJS, the
// StarlingMonkey fetch event): a page with an ESI include and the
// fragment it includes. Built by policies/components/build.sh js.
//
//   inlay serve --component target/components/hello-js.wasm

const page = `<html><body><h1>JavaScript component</h1>
<esi:include src="/fragment"/>
</body></html>
`;

function big(kb) {
  const line = '<p>Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do.</p>\n';
  let s = '<html><body>\n';
  while (s.length + line.length + 16 <= kb * 1024) s += line;
  return s + '</body></html>\n';
}

async function handle(request) {
  const url = new URL(request.url);
  switch (url.pathname) {
    case '/':
      return new Response(page, {
        headers: {
          'content-type': 'text/html; charset=utf-8',
          'cache-control': 'max-age=60',
          'surrogate-control': 'content="ESI/1.0"',
        },
      });
    case '/fragment':
      return new Response('<p>fragment from a JavaScript component</p>', {
        headers: { 'content-type': 'text/html', 'cache-control': 'max-age=60' },
      });
    case '/hello':
      return new Response('hello from a JavaScript component\n', {
        headers: { 'content-type': 'text/plain', 'cache-control': 'max-age=60' },
      });
    case '/big':
      return new Response(big(Number(url.searchParams.get('kb') ?? 16)), {
        headers: { 'content-type': 'text/html' },
      });
    case '/fetch': {
      // An outgoing request: only configured backends answer.
      try {
        const r = await fetch(url.searchParams.get('url'));
        return new Response(`${r.status} ${await r.text()}`, {
          headers: { 'cache-control': 'no-store' },
        });
      } catch (e) {
        return new Response(`error: ${e}`, { headers: { 'cache-control': 'no-store' } });
      }
    }
    default:
      return new Response('not found\n', { status: 404 });
  }
}

addEventListener('fetch', (event) => event.respondWith(handle(event.request)));

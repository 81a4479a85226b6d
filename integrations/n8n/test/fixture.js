'use strict';
// Unit-test fixtures: a fake n8n execution context (IExecuteFunctions) whose HTTP helper makes
// real requests, and a small in-process http.createServer standing in for `werk serve`. The real
// server and the real n8n run in e2e/test_n8n_workflow.py.
const http = require('node:http');

/** Start a fixture server; `handler(req, body)` returns {status, json?, bytes?, type?}. */
async function fixtureServer(handler) {
	const requests = [];
	const server = http.createServer((req, res) => {
		const chunks = [];
		req.on('data', (c) => chunks.push(c));
		req.on('end', async () => {
			const raw = Buffer.concat(chunks).toString('utf8');
			const body = raw ? JSON.parse(raw) : undefined;
			requests.push({ method: req.method, url: req.url, headers: req.headers, body });
			const answer = (await handler(req, body)) ?? { status: 404, json: { error: { code: 'not_found', message: 'no route' } } };
			if (answer.bytes) {
				res.writeHead(answer.status ?? 200, { 'content-type': answer.type ?? 'application/octet-stream' });
				res.end(answer.bytes);
			} else {
				res.writeHead(answer.status ?? 200, { 'content-type': 'application/json' });
				res.end(JSON.stringify(answer.json ?? {}));
			}
		});
	});
	await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
	const url = `http://127.0.0.1:${server.address().port}`;
	return { url, requests, close: () => new Promise((resolve) => server.close(resolve)) };
}

/** A fake IExecuteFunctions: `params` by name, `items` the input, credentials {baseUrl, apiKey}. */
function fakeContext({ params = {}, items = [{ json: {} }], credentials = {}, continueOnFail = false }) {
	const node = { id: 'n1', name: 'Werk', type: 'n8n-nodes-werk.test', typeVersion: 1, position: [0, 0], parameters: {} };
	const logged = [];
	const ctx = {
		logged,
		getInputData: () => items,
		getNode: () => node,
		continueOnFail: () => continueOnFail,
		getCredentials: async () => ({ baseUrl: 'http://127.0.0.1:9', apiKey: '', ...credentials }),
		getNodeParameter: (name, _i, fallback) => (name in params ? params[name] : fallback),
		logger: { debug: (m) => logged.push(m), info: (m) => logged.push(m), warn: (m) => logged.push(m), error: (m) => logged.push(m) },
		helpers: {
			async httpRequestWithAuthentication(_credential, options) {
				const creds = await ctx.getCredentials();
				const url = new URL(options.url);
				for (const [k, v] of Object.entries(options.qs ?? {})) url.searchParams.set(k, String(v));
				const headers = { ...(options.headers ?? {}) };
				if (creds.apiKey) headers.Authorization = `Bearer ${creds.apiKey}`;
				let body;
				if (options.body !== undefined) {
					headers['content-type'] = 'application/json';
					body = JSON.stringify(options.body);
				}
				const response = await fetch(url, { method: options.method, headers, body });
				const buffer = Buffer.from(await response.arrayBuffer());
				let parsed = buffer;
				if (options.encoding !== 'arraybuffer') {
					try {
						parsed = JSON.parse(buffer.toString('utf8'));
					} catch {
						parsed = buffer.toString('utf8');
					}
				}
				if (!options.ignoreHttpStatusErrors && !response.ok) throw new Error(`HTTP ${response.status}`);
				return { statusCode: response.status, body: parsed, headers: Object.fromEntries(response.headers) };
			},
			async prepareBinaryData(buffer, fileName, mimeType) {
				return { data: Buffer.from(buffer).toString('base64'), fileName, mimeType };
			},
			async getBinaryDataBuffer(i, field) {
				return Buffer.from(items[i].binary[field].data, 'base64');
			},
		},
	};
	return ctx;
}

/** An envelope as `/werk/v1` answers. */
const envelope = (data) => ({ protocol: { major: 1, minor: 0 }, request_id: 'req_test', data });
const werkError = (code, message, retryable = false) => ({
	protocol: { major: 1, minor: 0 },
	request_id: 'req_err',
	error: { code, message, retryable },
});

module.exports = { fixtureServer, fakeContext, envelope, werkError };

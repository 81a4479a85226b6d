'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const { WerkPrefillDecode, buildPrefillBody, buildDecodeBody } = require('../dist/nodes/WerkPrefillDecode/WerkPrefillDecode.node.js');
const { fixtureServer, fakeContext, envelope, werkError } = require('./fixture');

const HANDOFF = 'wh_' + 'S3cr3tHandoffValue_abcdefghijklmnopqrstuvw';
const NEXT = 'wh_' + 'NextHandoffValue_0123456789abcdefghijklmnop';

function werkFixture({ decodeHandoff = null } = {}) {
	const used = new Set();
	return fixtureServer((req, body) => {
		if (req.url === '/werk/v1/prefill')
			return { json: envelope({ handoff: HANDOFF, state_id: 'st_1', prompt_tokens: 5, reused: false, tier: 'ram', expires_unix_ms: 1 }) };
		if (req.url === '/werk/v1/decode') {
			if (used.has(body.handoff)) return { status: 410, json: werkError('expired_handoff', 'handoff expired or already used') };
			if (body.handoff !== HANDOFF) return { status: 400, json: werkError('invalid_request', 'unknown handoff') };
			used.add(body.handoff);
			return { json: envelope({ text: 'Paris.', handoff: decodeHandoff, completion_tokens: 2, finish_reason: 'stop' }) };
		}
	});
}

test('prefill body: policy only when a mode is chosen', () => {
	assert.deepEqual(buildPrefillBody({ modelId: 'm', text: 't', allowExperimental: false, policyMode: 'unset' }), {
		model_id: 'm',
		input: { type: 'text', text: 't' },
	});
	assert.deepEqual(buildPrefillBody({ modelId: 'm', text: 't', allowExperimental: true, policyMode: 'disk', ttlSeconds: 60 }), {
		model_id: 'm',
		input: { type: 'text', text: 't' },
		allow_experimental: true,
		policy: { mode: 'disk', ttl_seconds: 60 },
	});
	assert.deepEqual(buildDecodeBody('h', { maxTokens: 4, stop: 'a\n\nb' }), { handoff: 'h', max_tokens: 4, stop: ['a', 'b'] });
});

test('prefill keeps the handoff only in binary, decode reads it from there', async () => {
	const server = await werkFixture();
	try {
		const prefill = fakeContext({
			params: { operation: 'prefill', modelId: 'smollm2', text: 'The capital of France is', policyMode: 'unset', policyOptions: {} },
			credentials: { baseUrl: server.url },
		});
		const [prefilled] = await new WerkPrefillDecode().execute.call(prefill);
		const item = prefilled[0];
		assert.deepEqual(item.json, {
			state_id: 'st_1',
			prompt_tokens: 5,
			reused: false,
			tier: 'ram',
			expires_unix_ms: 1,
			handoff: '[in binary werkHandoff]',
		});
		assert.ok(!JSON.stringify(item.json).includes(HANDOFF));
		assert.equal(item.binary.werkHandoff.mimeType, 'application/vnd.werk.handoff');
		assert.equal(Buffer.from(item.binary.werkHandoff.data, 'base64').toString(), HANDOFF);

		const decode = fakeContext({ params: { operation: 'decode', maxTokens: 8, options: {} }, items: prefilled, credentials: { baseUrl: server.url } });
		const [decoded] = await new WerkPrefillDecode().execute.call(decode);
		assert.deepEqual(decoded[0].json, { text: 'Paris.', completion_tokens: 2, finish_reason: 'stop', handoff: null });
		assert.equal(decoded[0].binary, undefined, 'a used handoff is dropped from the item');
		assert.deepEqual(server.requests[1].body, { handoff: HANDOFF, max_tokens: 8 });
		assert.ok(!decode.logged.join('\n').includes(HANDOFF));

		// Single use: the same handoff again is 410 expired_handoff, and the error says to prefill again.
		const again = fakeContext({ params: { operation: 'decode', maxTokens: 8, options: {} }, items: prefilled, credentials: { baseUrl: server.url } });
		await assert.rejects(new WerkPrefillDecode().execute.call(again), (error) => {
			assert.match(error.message, /expired_handoff/);
			assert.match(error.message, /run Werk Prefill again/);
			const text = JSON.stringify({ message: error.message, description: error.description, context: error.context, cause: String(error.cause) });
			assert.ok(!text.includes(HANDOFF), 'the handoff is in no error text');
			assert.equal(error.httpCode, '410');
			return true;
		});
	} finally {
		await server.close();
	}
});

test('a continuation handoff goes back to binary, never JSON', async () => {
	const server = await werkFixture({ decodeHandoff: NEXT });
	try {
		const items = [{ json: {}, binary: { werkHandoff: { data: Buffer.from(HANDOFF).toString('base64'), mimeType: 'application/vnd.werk.handoff' } } }];
		const ctx = fakeContext({ params: { operation: 'decode', maxTokens: 8, options: {} }, items, credentials: { baseUrl: server.url } });
		const [out] = await new WerkPrefillDecode().execute.call(ctx);
		assert.equal(out[0].json.handoff, '[in binary werkHandoff]');
		assert.ok(!JSON.stringify(out[0].json).includes(NEXT));
		assert.equal(Buffer.from(out[0].binary.werkHandoff.data, 'base64').toString(), NEXT);
	} finally {
		await server.close();
	}
});

test('decode without a handoff binary fails before any request', async () => {
	const server = await werkFixture();
	try {
		const ctx = fakeContext({ params: { operation: 'decode', maxTokens: 8, options: {} }, credentials: { baseUrl: server.url } });
		await assert.rejects(new WerkPrefillDecode().execute.call(ctx), /No handoff in binary field "werkHandoff"/);
		assert.equal(server.requests.length, 0);
	} finally {
		await server.close();
	}
});

test('an error message echoing a handoff is redacted, also with continue-on-fail', async () => {
	const server = await fixtureServer(() => ({ status: 400, json: werkError('invalid_request', `bad handoff ${HANDOFF}`) }));
	try {
		const items = [{ json: {}, binary: { werkHandoff: { data: Buffer.from(HANDOFF).toString('base64') } } }];
		const ctx = fakeContext({ params: { operation: 'decode', maxTokens: 8, options: {} }, items, credentials: { baseUrl: server.url }, continueOnFail: true });
		const [out] = await new WerkPrefillDecode().execute.call(ctx);
		assert.match(out[0].json.error, /invalid_request: bad handoff \[redacted handoff\]/);
		assert.ok(!JSON.stringify(out).includes(HANDOFF));
	} finally {
		await server.close();
	}
});

'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const { buildChatBody, WerkChat } = require('../dist/nodes/WerkChat/WerkChat.node.js');
const { fixtureServer, fakeContext } = require('./fixture');

test('chat body omits unset fields and the werk member', () => {
	const body = buildChatBody({ model: '', systemPrompt: '', prompt: 'hi', reasoningTier: 'unset', backendOptions: {} });
	assert.deepEqual(body, { messages: [{ role: 'user', content: 'hi' }] });
});

test('chat body carries sampling, the reasoning tier and backend options in werk', () => {
	const body = buildChatBody({
		model: 'smollm2',
		systemPrompt: 'Be brief.',
		prompt: 'hi',
		maxTokens: 16,
		temperature: 0,
		topP: 0.9,
		seed: 7,
		reasoningTier: 'high',
		backendOptions: { 'llama.cpp': { top_k: 20 } },
	});
	assert.deepEqual(body, {
		model: 'smollm2',
		messages: [
			{ role: 'system', content: 'Be brief.' },
			{ role: 'user', content: 'hi' },
		],
		max_tokens: 16,
		temperature: 0,
		top_p: 0.9,
		seed: 7,
		werk: { 'llama.cpp': { top_k: 20 }, reasoning: { tier: 'high' } },
	});
});

test('chat node posts to /v1/chat/completions with the key and maps the answer', async () => {
	const server = await fixtureServer((req) => {
		if (req.url === '/v1/chat/completions')
			return {
				json: {
					model: 'smollm2',
					choices: [{ message: { role: 'assistant', content: 'Hello!' }, finish_reason: 'stop' }],
					usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 },
				},
			};
	});
	try {
		const ctx = fakeContext({
			params: { prompt: 'Say hello', model: '', systemPrompt: '', reasoningTier: 'low', options: { maxTokens: 8, backendOptions: '{"llama.cpp": {"top_k": 1}}' } },
			credentials: { baseUrl: server.url + '/', apiKey: 'sk-test' },
		});
		const [out] = await new WerkChat().execute.call(ctx);
		assert.deepEqual(out[0].json, {
			text: 'Hello!',
			finish_reason: 'stop',
			usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 },
			model: 'smollm2',
		});
		const [request] = server.requests;
		assert.equal(request.method, 'POST');
		assert.equal(request.headers.authorization, 'Bearer sk-test');
		assert.deepEqual(request.body, {
			messages: [{ role: 'user', content: 'Say hello' }],
			max_tokens: 8,
			werk: { 'llama.cpp': { top_k: 1 }, reasoning: { tier: 'low' } },
		});
	} finally {
		await server.close();
	}
});

test("chat node surfaces OpenAI's error shape with message and code", async () => {
	const server = await fixtureServer(() => ({
		status: 404,
		json: { error: { message: "model 'nope' not found", type: 'invalid_request_error', param: 'model', code: 'model_not_found' } },
	}));
	try {
		const ctx = fakeContext({ params: { prompt: 'x', model: 'nope', options: {} }, credentials: { baseUrl: server.url } });
		await assert.rejects(new WerkChat().execute.call(ctx), (error) => {
			assert.equal(error.constructor.name, 'NodeApiError');
			assert.match(error.message, /model_not_found/);
			assert.match(error.message, /model 'nope' not found/);
			assert.equal(error.httpCode, '404');
			return true;
		});
	} finally {
		await server.close();
	}
});

test('chat node with continue-on-fail returns the error as an item', async () => {
	const server = await fixtureServer(() => ({ status: 401, json: { protocol: { major: 1, minor: 0 }, request_id: 'r1', error: { code: 'unauthorized', message: 'missing or unknown API key', retryable: false } } }));
	try {
		const ctx = fakeContext({ params: { prompt: 'x', options: {} }, credentials: { baseUrl: server.url }, continueOnFail: true });
		const [out] = await new WerkChat().execute.call(ctx);
		assert.match(out[0].json.error, /unauthorized: missing or unknown API key/);
	} finally {
		await server.close();
	}
});

test('invalid backend options JSON fails before any request', async () => {
	const server = await fixtureServer(() => ({ json: {} }));
	try {
		const ctx = fakeContext({ params: { prompt: 'x', options: { backendOptions: '{nope' } }, credentials: { baseUrl: server.url } });
		await assert.rejects(new WerkChat().execute.call(ctx), /Backend Options is not valid JSON/);
		assert.equal(server.requests.length, 0);
	} finally {
		await server.close();
	}
});

'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const { WerkImage, buildImageJob } = require('../dist/nodes/WerkImage/WerkImage.node.js');
const { WerkSpeech, buildSpeechJob } = require('../dist/nodes/WerkSpeech/WerkSpeech.node.js');
const { describeError } = require('../dist/nodes/shared/transport.js');
const { fixtureServer, fakeContext, envelope, werkError } = require('./fixture');

const PNG = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 1, 2, 3]);

/** A job fixture: `polls` views of status before the final one. */
function jobServer(final, { polls = 2, file = 'image-0.png', type = 'image/png', bytes = PNG } = {}) {
	let seen = 0;
	return fixtureServer((req, body) => {
		if (req.method === 'POST' && req.url === '/werk/v1/jobs') return { status: 202, json: envelope({ id: 'job_1', kind: body.kind, status: 'queued' }) };
		if (req.method === 'GET' && req.url === '/werk/v1/jobs/job_1') {
			seen += 1;
			if (seen < polls) return { json: envelope({ id: 'job_1', status: 'running', progress: { step: 1, steps: 2, fraction: 0.5 } }) };
			return { json: envelope({ id: 'job_1', kind: 'image', model: 'sd', status: final, results: final === 'succeeded' ? [{ name: file, bytes: bytes.length, content_type: type }] : [], error: final === 'failed' ? { code: 'backend_error', message: 'out of memory' } : null }) };
		}
		if (req.url === `/werk/v1/jobs/job_1/result/${file}`) return { bytes, type };
		if (req.url === '/werk/v1/jobs/job_1/cancel') return { json: envelope({ id: 'job_1', status: 'cancelled' }) };
	});
}

test('image and speech job bodies omit unset fields', () => {
	assert.deepEqual(buildImageJob({ model: '', prompt: 'a cat' }), { kind: 'image', input: { prompt: 'a cat' } });
	assert.deepEqual(buildImageJob({ model: 'sd', prompt: 'a cat', width: 64, height: 64, steps: 2, seed: 1, guidanceScale: 3, negativePrompt: 'dog' }), {
		kind: 'image',
		model: 'sd',
		input: { prompt: 'a cat', negative_prompt: 'dog', width: 64, height: 64, steps: 2, guidance_scale: 3, seed: 1 },
	});
	assert.deepEqual(buildSpeechJob({ model: 'tts', input: 'hi', voice: 'alba', responseFormat: 'wav' }), {
		kind: 'speech',
		model: 'tts',
		input: { input: 'hi', voice: 'alba', response_format: 'wav' },
	});
	assert.deepEqual(buildSpeechJob({ model: '', input: 'hi', voice: '', responseFormat: 'unset' }), { kind: 'speech', input: { input: 'hi' } });
});

test('image node polls the job and puts the PNG in binary image', async () => {
	const server = await jobServer('succeeded');
	try {
		const ctx = fakeContext({ params: { prompt: 'a cat', options: { width: 64 }, pollIntervalMs: 100, timeoutSeconds: 10 }, credentials: { baseUrl: server.url } });
		const [out] = await new WerkImage().execute.call(ctx);
		assert.equal(out[0].json.status, 'succeeded');
		assert.equal(out[0].binary.image.mimeType, 'image/png');
		assert.deepEqual(Buffer.from(out[0].binary.image.data, 'base64'), PNG);
		assert.deepEqual(server.requests[0].body, { kind: 'image', input: { prompt: 'a cat', width: 64 } });
	} finally {
		await server.close();
	}
});

test('speech node puts the audio in binary audio', async () => {
	const wav = Buffer.from('RIFF....WAVE');
	const server = await jobServer('succeeded', { file: 'speech.wav', type: 'audio/wav', bytes: wav });
	try {
		const ctx = fakeContext({ params: { input: 'hello', voice: '', responseFormat: 'wav', options: {}, pollIntervalMs: 100, timeoutSeconds: 10 }, credentials: { baseUrl: server.url } });
		const [out] = await new WerkSpeech().execute.call(ctx);
		assert.equal(out[0].binary.audio.mimeType, 'audio/wav');
		assert.deepEqual(Buffer.from(out[0].binary.audio.data, 'base64'), wav);
	} finally {
		await server.close();
	}
});

test('a failed job is an error with its message', async () => {
	const server = await jobServer('failed');
	try {
		const ctx = fakeContext({ params: { prompt: 'a cat', options: {}, pollIntervalMs: 100, timeoutSeconds: 10 }, credentials: { baseUrl: server.url } });
		await assert.rejects(new WerkImage().execute.call(ctx), /job_1 failed backend_error: out of memory/);
	} finally {
		await server.close();
	}
});

test('polling is bounded: a job past the timeout is cancelled and fails', async () => {
	const server = await jobServer('succeeded', { polls: 1e9 });
	try {
		const ctx = fakeContext({ params: { prompt: 'a cat', options: {}, pollIntervalMs: 100, timeoutSeconds: 1 }, credentials: { baseUrl: server.url } });
		await assert.rejects(new WerkImage().execute.call(ctx), /did not finish within 1 s/);
		assert.ok(server.requests.some((r) => r.url === '/werk/v1/jobs/job_1/cancel'));
	} finally {
		await server.close();
	}
});

test('error envelopes: Werk, OpenAI and anything else', () => {
	assert.deepEqual(describeError(410, werkError('expired_handoff', 'gone')), {
		code: 'expired_handoff',
		message: 'gone',
		requestId: 'req_err',
		retryable: false,
		type: undefined,
	});
	const openai = describeError(400, { error: { message: 'bad', type: 'invalid_request_error', param: null, code: null } });
	assert.equal(openai.code, 'invalid_request_error');
	assert.equal(openai.message, 'bad');
	assert.equal(describeError(502, '<html>').code, 'http_502');
	assert.equal(describeError(400, Buffer.from(JSON.stringify(werkError('not_found', 'no such job')))).code, 'not_found');
});

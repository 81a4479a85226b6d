'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const { WerkExperts, REFUSAL, buildExpertActionBody } = require('../dist/nodes/WerkExperts/WerkExperts.node.js');
const { fixtureServer, fakeContext, envelope } = require('./fixture');

test('experts node refuses without the opt-in and sends no request', async () => {
	const server = await fixtureServer(() => ({ json: envelope({ experts: [] }) }));
	try {
		for (const operation of ['list', 'action']) {
			const ctx = fakeContext({ params: { operation, modelId: 'm', expertIds: 'e1', action: 'pin' }, credentials: { baseUrl: server.url } });
			await assert.rejects(new WerkExperts().execute.call(ctx), (error) => {
				assert.equal(error.constructor.name, 'NodeOperationError');
				assert.equal(error.message, REFUSAL);
				return true;
			});
		}
		assert.equal(server.requests.length, 0);
	} finally {
		await server.close();
	}
});

test('experts list and action with the opt-in', async () => {
	const server = await fixtureServer((req) => {
		if (req.url.startsWith('/werk/v1/experts?')) return { json: envelope({ experts: [{ id: 'l0.e1' }], next_cursor: null }) };
		if (req.url === '/werk/v1/experts/actions') return { json: envelope({ experts: [], changed: false, dry_run: true }) };
	});
	try {
		const list = fakeContext({ params: { acceptExperimental: true, operation: 'list', modelId: 'mix' }, credentials: { baseUrl: server.url } });
		const [listed] = await new WerkExperts().execute.call(list);
		assert.deepEqual(listed[0].json.experts, [{ id: 'l0.e1' }]);
		assert.equal(server.requests[0].url, '/werk/v1/experts?model_id=mix&allow_experimental=true');
		const act = fakeContext({
			params: { acceptExperimental: true, operation: 'action', modelId: 'mix', expertIds: 'l0.e1, l0.e2 l0.e1', action: 'prefetch', targetTier: 'ram', dryRun: true },
			credentials: { baseUrl: server.url },
		});
		const [acted] = await new WerkExperts().execute.call(act);
		assert.equal(acted[0].json.dry_run, true);
		assert.deepEqual(server.requests[1].body, {
			model_id: 'mix',
			expert_ids: ['l0.e1', 'l0.e2'],
			action: 'prefetch',
			allow_experimental: true,
			target_tier: 'ram',
			dry_run: true,
		});
	} finally {
		await server.close();
	}
});

test('expert action body omits an unset target tier and dry run', () => {
	assert.deepEqual(buildExpertActionBody({ modelId: 'm', expertIds: 'a', action: 'evict', targetTier: 'unset', dryRun: false }), {
		model_id: 'm',
		expert_ids: ['a'],
		action: 'evict',
		allow_experimental: true,
	});
});

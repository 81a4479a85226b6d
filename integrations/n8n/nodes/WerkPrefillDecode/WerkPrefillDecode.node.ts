import type {
	IDataObject,
	IExecuteFunctions,
	INodeExecutionData,
	INodeType,
	INodeTypeDescription,
} from 'n8n-workflow';
import { NodeConnectionTypes, NodeOperationError } from 'n8n-workflow';

import {
	asNodeError,
	binaryWithout,
	CREDENTIAL,
	envelopeData,
	failedItem,
	HANDOFF_BINARY,
	HANDOFF_MIME,
	HANDOFF_PLACEHOLDER,
	werkRequest,
} from '../shared/transport';

export interface PrefillParameters {
	modelId: string;
	text: string;
	allowExperimental: boolean;
	policyMode: string;
	ttlSeconds?: number;
	reuse?: string;
	pin?: boolean;
}

/** The `/werk/v1/prefill` body: `policy` only when a mode is chosen. */
export function buildPrefillBody(p: PrefillParameters): IDataObject {
	const body: IDataObject = { model_id: p.modelId, input: { type: 'text', text: p.text } };
	if (p.allowExperimental) body.allow_experimental = true;
	if (p.policyMode && p.policyMode !== 'unset') {
		const policy: IDataObject = { mode: p.policyMode };
		if (p.reuse) policy.reuse = p.reuse;
		if (p.ttlSeconds !== undefined) policy.ttl_seconds = p.ttlSeconds;
		if (p.pin !== undefined) policy.pin = p.pin;
		body.policy = policy;
	}
	return body;
}

export interface DecodeParameters {
	maxTokens: number;
	temperature?: number;
	topP?: number;
	seed?: number;
	stop?: string;
	allowExperimental?: boolean;
}

/** The `/werk/v1/decode` body; the handoff is added by the caller, never logged. */
export function buildDecodeBody(handoff: string, p: DecodeParameters): IDataObject {
	const body: IDataObject = { handoff, max_tokens: p.maxTokens };
	if (p.temperature !== undefined) body.temperature = p.temperature;
	if (p.topP !== undefined) body.top_p = p.topP;
	if (p.seed !== undefined) body.seed = p.seed;
	const stop = (p.stop ?? '')
		.split('\n')
		.map((s) => s.replace(/\r$/, ''))
		.filter((s) => s.length > 0);
	if (stop.length > 0) body.stop = stop;
	if (p.allowExperimental) body.allow_experimental = true;
	return body;
}

/** The JSON a prefill shows: everything but the handoff itself. */
export function prefillJson(data: IDataObject): IDataObject {
	return {
		state_id: data.state_id ?? null,
		prompt_tokens: data.prompt_tokens ?? null,
		reused: data.reused ?? null,
		tier: data.tier ?? null,
		expires_unix_ms: data.expires_unix_ms ?? null,
		handoff: HANDOFF_PLACEHOLDER,
	};
}

export class WerkPrefillDecode implements INodeType {
	description: INodeTypeDescription = {
		displayName: 'Werk Prefill / Decode',
		name: 'werkPrefillDecode',
		icon: { light: 'file:werk.svg', dark: 'file:werk.dark.svg' },
		group: ['transform'],
		version: 1,
		subtitle: '={{$parameter["operation"]}}',
		description:
			'Split prefill and decode on a Werk host (POST /werk/v1/prefill, /werk/v1/decode); the handoff stays in binary',
		defaults: { name: 'Werk Prefill / Decode' },
		usableAsTool: true,
		inputs: [NodeConnectionTypes.Main],
		outputs: [NodeConnectionTypes.Main],
		credentials: [{ name: CREDENTIAL, required: true }],
		properties: [
			{
				displayName: 'Operation',
				name: 'operation',
				type: 'options',
				noDataExpression: true,
				options: [
					{
						name: 'Prefill',
						value: 'prefill',
						description: 'Process a prompt; its handoff goes to the binary field werkHandoff',
						action: 'Prefill a prompt',
					},
					{
						name: 'Decode',
						value: 'decode',
						description: 'Generate from the handoff in a binary field (single use)',
						action: 'Decode from a handoff',
					},
				],
				default: 'prefill',
			},
			{
				displayName: 'Model ID',
				name: 'modelId',
				type: 'string',
				default: '',
				required: true,
				displayOptions: { show: { operation: ['prefill'] } },
			},
			{
				displayName: 'Text',
				name: 'text',
				type: 'string',
				typeOptions: { rows: 4 },
				default: '',
				required: true,
				displayOptions: { show: { operation: ['prefill'] } },
				description: 'The prompt text (input type "text")',
			},
			{
				displayName: 'Allow Experimental',
				name: 'allowExperimental',
				type: 'boolean',
				default: false,
				displayOptions: { show: { operation: ['prefill'] } },
				description: 'Whether to send allow_experimental: true',
			},
			{
				displayName: 'Persistence Mode',
				name: 'policyMode',
				type: 'options',
				options: [
					{ name: 'Auto', value: 'auto' },
					{ name: 'Disk', value: 'disk' },
					{ name: 'Ephemeral', value: 'ephemeral' },
					{ name: 'Memory', value: 'memory' },
					{ name: 'Unset (Server Default)', value: 'unset' },
				],
				default: 'unset',
				displayOptions: { show: { operation: ['prefill'] } },
				description: 'Policy.mode; Unset sends no policy',
			},
			{
				displayName: 'Policy Options',
				name: 'policyOptions',
				type: 'collection',
				placeholder: 'Add Option',
				default: {},
				displayOptions: { show: { operation: ['prefill'] } },
				options: [
					{
						displayName: 'Pin',
						name: 'pin',
						type: 'boolean',
						default: false,
					},
					{
						displayName: 'Reuse',
						name: 'reuse',
						type: 'options',
						options: [
							{ name: 'Prefer', value: 'prefer' },
							{ name: 'Required', value: 'required' },
							{ name: 'Disabled', value: 'disabled' },
						],
						default: 'prefer',
					},
					{
						displayName: 'TTL Seconds',
						name: 'ttlSeconds',
						type: 'number',
						typeOptions: { minValue: 1 },
						default: 600,
					},
				],
			},
			{
				displayName: 'Handoff Binary Field',
				name: 'binaryPropertyName',
				type: 'string',
				default: HANDOFF_BINARY,
				displayOptions: { show: { operation: ['decode'] } },
				description: 'The binary field holding the handoff of a Werk Prefill',
			},
			{
				displayName: 'Max Tokens',
				name: 'maxTokens',
				type: 'number',
				typeOptions: { minValue: 1 },
				default: 256,
				displayOptions: { show: { operation: ['decode'] } },
			},
			{
				displayName: 'Options',
				name: 'options',
				type: 'collection',
				placeholder: 'Add Option',
				default: {},
				displayOptions: { show: { operation: ['decode'] } },
				options: [
					{
						displayName: 'Allow Experimental',
						name: 'allowExperimental',
						type: 'boolean',
						default: false,
						description: 'Whether to send allow_experimental: true',
					},
					{
						displayName: 'Seed',
						name: 'seed',
						type: 'number',
						default: 0,
					},
					{
						displayName: 'Stop Sequences',
						name: 'stop',
						type: 'string',
						typeOptions: { rows: 2 },
						default: '',
						description: 'One stop string per line',
					},
					{
						displayName: 'Temperature',
						name: 'temperature',
						type: 'number',
						typeOptions: { minValue: 0, maxValue: 2, numberPrecision: 2 },
						default: 0.7,
					},
					{
						displayName: 'Top P',
						name: 'topP',
						type: 'number',
						typeOptions: { minValue: 0, maxValue: 1, numberPrecision: 2 },
						default: 1,
					},
				],
			},
		],
	};

	async execute(this: IExecuteFunctions): Promise<INodeExecutionData[][]> {
		const items = this.getInputData();
		const operation = this.getNodeParameter('operation', 0) as string;
		const out: INodeExecutionData[] = [];
		for (let i = 0; i < items.length; i++) {
			const secrets: string[] = [];
			try {
				if (operation === 'prefill') {
					const policy = this.getNodeParameter('policyOptions', i, {}) as IDataObject;
					const body = buildPrefillBody({
						modelId: this.getNodeParameter('modelId', i) as string,
						text: this.getNodeParameter('text', i) as string,
						allowExperimental: this.getNodeParameter('allowExperimental', i, false) as boolean,
						policyMode: this.getNodeParameter('policyMode', i, 'unset') as string,
						ttlSeconds: policy.ttlSeconds as number | undefined,
						reuse: policy.reuse as string | undefined,
						pin: policy.pin as boolean | undefined,
					});
					const data = envelopeData(
						await werkRequest(this, { method: 'POST', path: '/werk/v1/prefill', body }, i),
					);
					const handoff = String(data.handoff ?? '');
					secrets.push(handoff);
					if (!handoff) throw new NodeOperationError(this.getNode(), 'Werk prefill answered without a handoff');
					const binary = binaryWithout(items[i], HANDOFF_BINARY);
					binary[HANDOFF_BINARY] = await this.helpers.prepareBinaryData(
						Buffer.from(handoff, 'utf8'),
						'werk.handoff',
						HANDOFF_MIME,
					);
					out.push({ json: prefillJson(data), binary, pairedItem: { item: i } });
				} else {
					const field = this.getNodeParameter('binaryPropertyName', i, HANDOFF_BINARY) as string;
					if (!items[i].binary?.[field]) {
						throw new NodeOperationError(
							this.getNode(),
							`No handoff in binary field "${field}": connect this node after a Werk Prefill`,
							{ itemIndex: i },
						);
					}
					const handoff = (await this.helpers.getBinaryDataBuffer(i, field)).toString('utf8').trim();
					secrets.push(handoff);
					if (!handoff) {
						throw new NodeOperationError(this.getNode(), `Binary field "${field}" is empty`, { itemIndex: i });
					}
					const options = this.getNodeParameter('options', i, {}) as IDataObject;
					const body = buildDecodeBody(handoff, {
						maxTokens: this.getNodeParameter('maxTokens', i, 256) as number,
						temperature: options.temperature as number | undefined,
						topP: options.topP as number | undefined,
						seed: options.seed as number | undefined,
						stop: options.stop as string | undefined,
						allowExperimental: options.allowExperimental as boolean | undefined,
					});
					const data = envelopeData(
						await werkRequest(this, { method: 'POST', path: '/werk/v1/decode', body, secrets }, i),
					);
					const binary = binaryWithout(items[i], field);
					const next = typeof data.handoff === 'string' && data.handoff ? data.handoff : null;
					if (next) {
						secrets.push(next);
						binary[HANDOFF_BINARY] = await this.helpers.prepareBinaryData(
							Buffer.from(next, 'utf8'),
							'werk.handoff',
							HANDOFF_MIME,
						);
					}
					const item: INodeExecutionData = {
						json: {
							text: data.text ?? '',
							completion_tokens: data.completion_tokens ?? null,
							finish_reason: data.finish_reason ?? null,
							handoff: next ? '[in binary werkHandoff]' : null,
						},
						pairedItem: { item: i },
					};
					if (Object.keys(binary).length > 0) item.binary = binary;
					out.push(item);
				}
			} catch (error) {
				const failure = asNodeError(this, error, i);
				if (this.continueOnFail()) {
					out.push(failedItem(failure, i, secrets));
					continue;
				}
				throw failure;
			}
		}
		return [out];
	}
}

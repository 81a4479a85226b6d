import type {
	IDataObject,
	IExecuteFunctions,
	INodeExecutionData,
	INodeType,
	INodeTypeDescription,
} from 'n8n-workflow';
import { NodeConnectionTypes, NodeOperationError } from 'n8n-workflow';

import { asNodeError, CREDENTIAL, failedItem, jsonObjectParameter, werkRequest } from '../shared/transport';

export const REASONING_TIERS = ['default', 'none', 'low', 'medium', 'high', 'max'];

export interface ChatParameters {
	model: string;
	systemPrompt: string;
	prompt: string;
	maxTokens?: number;
	temperature?: number;
	topP?: number;
	seed?: number;
	reasoningTier: string;
	backendOptions: IDataObject;
}

/** The `/v1/chat/completions` body: unset fields omitted, `werk` only when it has members. */
export function buildChatBody(p: ChatParameters): IDataObject {
	const messages: IDataObject[] = [];
	if (p.systemPrompt) messages.push({ role: 'system', content: p.systemPrompt });
	messages.push({ role: 'user', content: p.prompt });
	const body: IDataObject = { messages };
	if (p.model) body.model = p.model;
	if (p.maxTokens !== undefined) body.max_tokens = p.maxTokens;
	if (p.temperature !== undefined) body.temperature = p.temperature;
	if (p.topP !== undefined) body.top_p = p.topP;
	if (p.seed !== undefined) body.seed = p.seed;
	const werk: IDataObject = { ...p.backendOptions };
	if (p.reasoningTier && p.reasoningTier !== 'unset') werk.reasoning = { tier: p.reasoningTier };
	if (Object.keys(werk).length > 0) body.werk = werk;
	return body;
}

export class WerkChat implements INodeType {
	description: INodeTypeDescription = {
		displayName: 'Werk Chat',
		name: 'werkChat',
		icon: { light: 'file:werk.svg', dark: 'file:werk.dark.svg' },
		group: ['transform'],
		version: 1,
		subtitle: '={{$parameter["model"] || "server default model"}}',
		description: 'Chat completion on a Werk host (POST /v1/chat/completions)',
		defaults: { name: 'Werk Chat' },
		usableAsTool: true,
		inputs: [NodeConnectionTypes.Main],
		outputs: [NodeConnectionTypes.Main],
		credentials: [{ name: CREDENTIAL, required: true }],
		properties: [
			{
				displayName: 'Model',
				name: 'model',
				type: 'string',
				default: '',
				description: 'Model or alias name; empty takes the server default',
			},
			{
				displayName: 'System Prompt',
				name: 'systemPrompt',
				type: 'string',
				typeOptions: { rows: 3 },
				default: '',
			},
			{
				displayName: 'Prompt',
				name: 'prompt',
				type: 'string',
				typeOptions: { rows: 4 },
				default: '',
				required: true,
				description: 'The user message',
			},
			{
				displayName: 'Reasoning Tier',
				name: 'reasoningTier',
				type: 'options',
				options: [
					{ name: 'Default', value: 'default' },
					{ name: 'High', value: 'high' },
					{ name: 'Low', value: 'low' },
					{ name: 'Max', value: 'max' },
					{ name: 'Medium', value: 'medium' },
					{ name: 'None', value: 'none' },
					{ name: 'Unset', value: 'unset' },
				],
				default: 'unset',
				description: 'Sent as werk.reasoning.tier; Unset sends nothing',
			},
			{
				displayName: 'Options',
				name: 'options',
				type: 'collection',
				placeholder: 'Add Option',
				default: {},
				options: [
					{
						displayName: 'Backend Options (JSON)',
						name: 'backendOptions',
						type: 'json',
						default: '{}',
						description:
							'Members merged into the body\'s "werk" object, one per backend, e.g. {"llama.cpp": {"top_k": 20}}',
					},
					{
						displayName: 'Max Tokens',
						name: 'maxTokens',
						type: 'number',
						typeOptions: { minValue: 1 },
						default: 256,
					},
					{
						displayName: 'Seed',
						name: 'seed',
						type: 'number',
						default: 0,
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
		const out: INodeExecutionData[] = [];
		for (let i = 0; i < items.length; i++) {
			try {
				const options = this.getNodeParameter('options', i, {}) as IDataObject;
				const prompt = this.getNodeParameter('prompt', i) as string;
				if (!prompt) throw new NodeOperationError(this.getNode(), 'Prompt is empty', { itemIndex: i });
				const body = buildChatBody({
					model: this.getNodeParameter('model', i, '') as string,
					systemPrompt: this.getNodeParameter('systemPrompt', i, '') as string,
					prompt,
					maxTokens: options.maxTokens as number | undefined,
					temperature: options.temperature as number | undefined,
					topP: options.topP as number | undefined,
					seed: options.seed as number | undefined,
					reasoningTier: this.getNodeParameter('reasoningTier', i, 'unset') as string,
					backendOptions: jsonObjectParameter(this, options.backendOptions, 'Backend Options', i),
				});
				const response = await werkRequest(this, { method: 'POST', path: '/v1/chat/completions', body }, i);
				const answer = response.body as IDataObject;
				const choices = (answer.choices as IDataObject[] | undefined) ?? [];
				const first = choices[0] ?? {};
				const message = (first.message as IDataObject | undefined) ?? {};
				out.push({
					json: {
						text: (message.content as string | null | undefined) ?? '',
						finish_reason: (first.finish_reason as string | null | undefined) ?? null,
						usage: (answer.usage as IDataObject | undefined) ?? null,
						model: (answer.model as string | undefined) ?? null,
					},
					pairedItem: { item: i },
				});
			} catch (error) {
				const failure = asNodeError(this, error, i);
				if (this.continueOnFail()) {
					out.push(failedItem(failure, i));
					continue;
				}
				throw failure;
			}
		}
		return [out];
	}
}

import type {
	IDataObject,
	IExecuteFunctions,
	INodeExecutionData,
	INodeType,
	INodeTypeDescription,
} from 'n8n-workflow';
import { NodeConnectionTypes, NodeOperationError } from 'n8n-workflow';

import { asNodeError, CREDENTIAL, envelopeData, failedItem, werkRequest } from '../shared/transport';

export const REFUSAL =
	'Werk Experts refused to run: expert controls are experimental. Turn on "I Accept Experimental Expert Controls" to send the request.';

export interface ExpertActionParameters {
	modelId: string;
	expertIds: string;
	action: string;
	targetTier: string;
	dryRun: boolean;
}

/** The `/werk/v1/experts/actions` body (`allow_experimental` is always true: the node is opted in). */
export function buildExpertActionBody(p: ExpertActionParameters): IDataObject {
	const ids = p.expertIds
		.split(/[\s,]+/)
		.map((s) => s.trim())
		.filter((s) => s.length > 0);
	const body: IDataObject = {
		model_id: p.modelId,
		expert_ids: [...new Set(ids)],
		action: p.action,
		allow_experimental: true,
	};
	if (p.targetTier && p.targetTier !== 'unset') body.target_tier = p.targetTier;
	if (p.dryRun) body.dry_run = true;
	return body;
}

export class WerkExperts implements INodeType {
	description: INodeTypeDescription = {
		displayName: 'Werk Experts',
		name: 'werkExperts',
		icon: { light: 'file:werk.svg', dark: 'file:werk.dark.svg' },
		group: ['transform'],
		version: 1,
		subtitle: '={{$parameter["operation"]}}',
		description:
			'Experimental mixture-of-experts controls on a Werk host (GET /werk/v1/experts, POST /werk/v1/experts/actions)',
		defaults: { name: 'Werk Experts' },
		usableAsTool: true,
		inputs: [NodeConnectionTypes.Main],
		outputs: [NodeConnectionTypes.Main],
		credentials: [{ name: CREDENTIAL, required: true }],
		properties: [
			{
				displayName: 'I Accept Experimental Expert Controls',
				name: 'acceptExperimental',
				type: 'boolean',
				default: false,
				description:
					'Whether to send the request at all: expert controls are experimental, and without this the node refuses to run',
			},
			{
				displayName: 'Operation',
				name: 'operation',
				type: 'options',
				noDataExpression: true,
				options: [
					{ name: 'List', value: 'list', description: 'List the experts of a model', action: 'List experts' },
					{
						name: 'Action',
						value: 'action',
						description: 'Prefetch, pin, unpin or evict experts',
						action: 'Act on experts',
					},
				],
				default: 'list',
			},
			{
				displayName: 'Model ID',
				name: 'modelId',
				type: 'string',
				default: '',
				required: true,
			},
			{
				displayName: 'Action',
				name: 'action',
				type: 'options',
				options: [
					{ name: 'Prefetch', value: 'prefetch' },
					{ name: 'Pin', value: 'pin' },
					{ name: 'Unpin', value: 'unpin' },
					{ name: 'Evict', value: 'evict' },
				],
				default: 'prefetch',
				displayOptions: { show: { operation: ['action'] } },
			},
			{
				displayName: 'Expert IDs',
				name: 'expertIds',
				type: 'string',
				default: '',
				required: true,
				displayOptions: { show: { operation: ['action'] } },
				description: 'Expert IDs separated by commas or spaces',
			},
			{
				displayName: 'Target Tier',
				name: 'targetTier',
				type: 'options',
				options: [
					{ name: 'Unset', value: 'unset' },
					{ name: 'RAM', value: 'ram' },
					{ name: 'VRAM', value: 'vram' },
				],
				default: 'unset',
				displayOptions: { show: { operation: ['action'] } },
				description: 'Target_tier (prefetch only)',
			},
			{
				displayName: 'Dry Run',
				name: 'dryRun',
				type: 'boolean',
				default: false,
				displayOptions: { show: { operation: ['action'] } },
				description: 'Whether to only report what the action would change',
			},
		],
	};

	async execute(this: IExecuteFunctions): Promise<INodeExecutionData[][]> {
		const items = this.getInputData();
		const out: INodeExecutionData[] = [];
		for (let i = 0; i < items.length; i++) {
			try {
				if (this.getNodeParameter('acceptExperimental', i, false) !== true) {
					throw new NodeOperationError(this.getNode(), REFUSAL, { itemIndex: i });
				}
				const operation = this.getNodeParameter('operation', i) as string;
				const modelId = this.getNodeParameter('modelId', i) as string;
				let data: IDataObject;
				if (operation === 'list') {
					data = envelopeData(
						await werkRequest(
							this,
							{ method: 'GET', path: '/werk/v1/experts', qs: { model_id: modelId, allow_experimental: 'true' } },
							i,
						),
					);
				} else {
					const body = buildExpertActionBody({
						modelId,
						expertIds: this.getNodeParameter('expertIds', i) as string,
						action: this.getNodeParameter('action', i) as string,
						targetTier: this.getNodeParameter('targetTier', i, 'unset') as string,
						dryRun: this.getNodeParameter('dryRun', i, false) as boolean,
					});
					data = envelopeData(await werkRequest(this, { method: 'POST', path: '/werk/v1/experts/actions', body }, i));
				}
				out.push({ json: data, pairedItem: { item: i } });
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

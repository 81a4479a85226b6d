import type {
	IDataObject,
	IExecuteFunctions,
	INodeExecutionData,
	INodeType,
	INodeTypeDescription,
} from 'n8n-workflow';
import { NodeConnectionTypes } from 'n8n-workflow';

import { jobJson, pollingProperties, runJob } from '../shared/jobs';
import { asNodeError, CREDENTIAL, failedItem } from '../shared/transport';

export interface ImageParameters {
	model: string;
	prompt: string;
	negativePrompt?: string;
	width?: number;
	height?: number;
	steps?: number;
	guidanceScale?: number;
	seed?: number;
}

/** The `kind: image` job (werk_host/protocol/media.py, ImageJobCreate): unset fields omitted. */
export function buildImageJob(p: ImageParameters): IDataObject {
	const input: IDataObject = { prompt: p.prompt };
	if (p.negativePrompt) input.negative_prompt = p.negativePrompt;
	if (p.width !== undefined) input.width = p.width;
	if (p.height !== undefined) input.height = p.height;
	if (p.steps !== undefined) input.steps = p.steps;
	if (p.guidanceScale !== undefined) input.guidance_scale = p.guidanceScale;
	if (p.seed !== undefined) input.seed = p.seed;
	const body: IDataObject = { kind: 'image', input };
	if (p.model) body.model = p.model;
	return body;
}

export class WerkImage implements INodeType {
	description: INodeTypeDescription = {
		displayName: 'Werk Image',
		name: 'werkImage',
		icon: { light: 'file:werk.svg', dark: 'file:werk.dark.svg' },
		group: ['transform'],
		version: 1,
		subtitle: '={{$parameter["model"] || "server default model"}}',
		description: 'Generate an image as a Werk job (POST /werk/v1/jobs, kind image); the PNG goes to binary "image"',
		defaults: { name: 'Werk Image' },
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
				description: 'Image model; empty takes the server default',
			},
			{
				displayName: 'Prompt',
				name: 'prompt',
				type: 'string',
				typeOptions: { rows: 3 },
				default: '',
				required: true,
			},
			{
				displayName: 'Options',
				name: 'options',
				type: 'collection',
				placeholder: 'Add Option',
				default: {},
				options: [
					{
						displayName: 'Guidance Scale',
						name: 'guidanceScale',
						type: 'number',
						typeOptions: { minValue: 0, maxValue: 50, numberPrecision: 1 },
						default: 7,
					},
					{
						displayName: 'Height',
						name: 'height',
						type: 'number',
						typeOptions: { minValue: 8, maxValue: 2048 },
						default: 512,
						description: 'A multiple of 8',
					},
					{
						displayName: 'Negative Prompt',
						name: 'negativePrompt',
						type: 'string',
						default: '',
					},
					{
						displayName: 'Seed',
						name: 'seed',
						type: 'number',
						typeOptions: { minValue: 0 },
						default: 0,
					},
					{
						displayName: 'Steps',
						name: 'steps',
						type: 'number',
						typeOptions: { minValue: 1, maxValue: 150 },
						default: 20,
					},
					{
						displayName: 'Width',
						name: 'width',
						type: 'number',
						typeOptions: { minValue: 8, maxValue: 2048 },
						default: 512,
						description: 'A multiple of 8',
					},
				],
			},
			...pollingProperties,
		],
	};

	async execute(this: IExecuteFunctions): Promise<INodeExecutionData[][]> {
		const items = this.getInputData();
		const out: INodeExecutionData[] = [];
		for (let i = 0; i < items.length; i++) {
			try {
				const options = this.getNodeParameter('options', i, {}) as IDataObject;
				const body = buildImageJob({
					model: this.getNodeParameter('model', i, '') as string,
					prompt: this.getNodeParameter('prompt', i) as string,
					negativePrompt: options.negativePrompt as string | undefined,
					width: options.width as number | undefined,
					height: options.height as number | undefined,
					steps: options.steps as number | undefined,
					guidanceScale: options.guidanceScale as number | undefined,
					seed: options.seed as number | undefined,
				});
				const { job, binary } = await runJob(this, body, 'image', i);
				out.push({ json: jobJson(job), binary, pairedItem: { item: i } });
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

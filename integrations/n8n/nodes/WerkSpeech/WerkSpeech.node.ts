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

export interface SpeechParameters {
	model: string;
	input: string;
	voice?: string;
	responseFormat?: string;
	instructions?: string;
	speed?: number;
	language?: string;
	seed?: number;
}

/** The `kind: speech` job (werk_host/protocol/speech.py, SpeechInput): unset fields omitted. */
export function buildSpeechJob(p: SpeechParameters): IDataObject {
	const input: IDataObject = { input: p.input };
	if (p.voice) input.voice = p.voice;
	if (p.responseFormat && p.responseFormat !== 'unset') input.response_format = p.responseFormat;
	if (p.instructions) input.instructions = p.instructions;
	if (p.speed !== undefined) input.speed = p.speed;
	if (p.language) input.language = p.language;
	if (p.seed !== undefined) input.seed = p.seed;
	const body: IDataObject = { kind: 'speech', input };
	if (p.model) body.model = p.model;
	return body;
}

export class WerkSpeech implements INodeType {
	description: INodeTypeDescription = {
		displayName: 'Werk Speech',
		name: 'werkSpeech',
		icon: { light: 'file:werk.svg', dark: 'file:werk.dark.svg' },
		group: ['transform'],
		version: 1,
		subtitle: '={{$parameter["model"] || "server default model"}}',
		description: 'Synthesize speech as a Werk job (POST /werk/v1/jobs, kind speech); the audio goes to binary "audio"',
		defaults: { name: 'Werk Speech' },
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
				description: 'Speech model; empty takes the server default',
			},
			{
				displayName: 'Text',
				name: 'input',
				type: 'string',
				typeOptions: { rows: 3 },
				default: '',
				required: true,
				description: 'The text to speak (at most 4096 characters)',
			},
			{
				displayName: 'Voice',
				name: 'voice',
				type: 'string',
				default: '',
				description: "A voice the model offers; empty takes the backend's default",
			},
			{
				displayName: 'Response Format',
				name: 'responseFormat',
				type: 'options',
				options: [
					{ name: 'Backend Default', value: 'unset' },
					{ name: 'FLAC', value: 'flac' },
					{ name: 'MP3', value: 'mp3' },
					{ name: 'PCM', value: 'pcm' },
					{ name: 'WAV', value: 'wav' },
				],
				default: 'wav',
			},
			{
				displayName: 'Options',
				name: 'options',
				type: 'collection',
				placeholder: 'Add Option',
				default: {},
				options: [
					{
						displayName: 'Instructions',
						name: 'instructions',
						type: 'string',
						default: '',
						description: 'A style prompt, for a backend that takes one',
					},
					{
						displayName: 'Language',
						name: 'language',
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
						displayName: 'Speed',
						name: 'speed',
						type: 'number',
						typeOptions: { minValue: 0.25, maxValue: 4, numberPrecision: 2 },
						default: 1,
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
				const body = buildSpeechJob({
					model: this.getNodeParameter('model', i, '') as string,
					input: this.getNodeParameter('input', i) as string,
					voice: this.getNodeParameter('voice', i, '') as string,
					responseFormat: this.getNodeParameter('responseFormat', i, 'wav') as string,
					instructions: options.instructions as string | undefined,
					speed: options.speed as number | undefined,
					language: options.language as string | undefined,
					seed: options.seed as number | undefined,
				});
				const { job, binary } = await runJob(this, body, 'audio', i);
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

import type { IBinaryData, IDataObject, IExecuteFunctions, INodeProperties } from 'n8n-workflow';
import { NodeOperationError, sleep } from 'n8n-workflow';

import { envelopeData, werkRequest } from './transport';

/** The polling parameters every job node has. */
export const pollingProperties: INodeProperties[] = [
	{
		displayName: 'Poll Interval (Ms)',
		name: 'pollIntervalMs',
		type: 'number',
		typeOptions: { minValue: 100 },
		default: 1000,
		description: 'How long to wait between GET /werk/v1/jobs/{ID}',
	},
	{
		displayName: 'Timeout (Seconds)',
		name: 'timeoutSeconds',
		type: 'number',
		typeOptions: { minValue: 1 },
		default: 600,
		description: 'How long to wait for the job before cancelling it and failing',
	},
];

export interface JobOutcome {
	job: IDataObject;
	binary: Record<string, IBinaryData>;
}

function fileNames(job: IDataObject): string[] {
	// JobView (werk_host/protocol/media.py) lists its result files in `results`.
	const files = (job.results ?? job.files ?? []) as IDataObject[];
	return files.map((f) => String(f.name)).filter((n) => n.length > 0);
}

/**
 * `POST /werk/v1/jobs`, then `GET /werk/v1/jobs/{id}` every interval until the job is terminal
 * (bounded by the timeout: the job is then cancelled), then each result file into binary
 * `field`, `field_2`, ...
 */
export async function runJob(
	ctx: IExecuteFunctions,
	body: IDataObject,
	field: string,
	itemIndex: number,
): Promise<JobOutcome> {
	const interval = Math.max(100, ctx.getNodeParameter('pollIntervalMs', itemIndex, 1000) as number);
	const timeoutMs = Math.max(1, ctx.getNodeParameter('timeoutSeconds', itemIndex, 600) as number) * 1000;
	let job = envelopeData(await werkRequest(ctx, { method: 'POST', path: '/werk/v1/jobs', body }, itemIndex));
	const id = String(job.id ?? '');
	if (!id) throw new NodeOperationError(ctx.getNode(), 'Werk answered the job without an id', { itemIndex });
	const path = `/werk/v1/jobs/${encodeURIComponent(id)}`;
	const deadline = Date.now() + timeoutMs;
	while (!['succeeded', 'failed', 'cancelled'].includes(String(job.status))) {
		if (Date.now() >= deadline) {
			try {
				await werkRequest(ctx, { method: 'POST', path: `${path}/cancel` }, itemIndex);
			} catch {
				// the timeout is the error to report
			}
			throw new NodeOperationError(
				ctx.getNode(),
				`Werk job ${id} did not finish within ${timeoutMs / 1000} s (status ${String(job.status)}); it was cancelled`,
				{ itemIndex },
			);
		}
		await sleep(Math.min(interval, Math.max(0, deadline - Date.now())));
		job = envelopeData(await werkRequest(ctx, { method: 'GET', path }, itemIndex));
	}
	if (job.status !== 'succeeded') {
		const error = (job.error ?? {}) as IDataObject;
		const code = error.code ? ` ${String(error.code)}` : '';
		throw new NodeOperationError(
			ctx.getNode(),
			`Werk job ${id} ${String(job.status)}${code}: ${String(error.message ?? 'no message')}`,
			{ itemIndex },
		);
	}
	const binary: Record<string, IBinaryData> = {};
	const names = fileNames(job);
	for (let n = 0; n < names.length; n++) {
		const name = names[n];
		const response = await werkRequest(
			ctx,
			{ method: 'GET', path: `${path}/result/${encodeURIComponent(name)}`, binary: true },
			itemIndex,
		);
		const headers = response.headers;
		const contentType = String(headers['content-type'] ?? 'application/octet-stream').split(';')[0];
		const bytes = Buffer.from(response.body as ArrayBuffer);
		binary[n === 0 ? field : `${field}_${n + 1}`] = await ctx.helpers.prepareBinaryData(bytes, name, contentType);
	}
	if (names.length === 0) {
		throw new NodeOperationError(ctx.getNode(), `Werk job ${id} succeeded without result files`, { itemIndex });
	}
	return { job, binary };
}

/** The JSON a finished job shows. */
export function jobJson(job: IDataObject): IDataObject {
	return {
		id: job.id ?? null,
		kind: job.kind ?? null,
		model: job.model ?? null,
		status: job.status ?? null,
		results: job.results ?? job.files ?? [],
		info: job.info ?? {},
		created_unix_ms: job.created_unix_ms ?? null,
		finished_unix_ms: job.finished_unix_ms ?? null,
	};
}

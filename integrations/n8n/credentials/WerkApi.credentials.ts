import type {
	IAuthenticateGeneric,
	Icon,
	ICredentialTestRequest,
	ICredentialType,
	INodeProperties,
} from 'n8n-workflow';

export class WerkApi implements ICredentialType {
	name = 'werkApi';

	displayName = 'Werk API';

	icon: Icon = { light: 'file:werk.svg', dark: 'file:werk.dark.svg' };

	documentationUrl = 'https://github.com/werk-host/werk/blob/main/docs/n8n.md';

	properties: INodeProperties[] = [
		{
			displayName: 'Base URL',
			name: 'baseUrl',
			type: 'string',
			default: 'http://127.0.0.1:11434',
			placeholder: 'http://127.0.0.1:11434',
			description: 'Where `werk serve` listens, without a path',
		},
		{
			displayName: 'API Key',
			name: 'apiKey',
			type: 'string',
			typeOptions: { password: true },
			default: '',
			description:
				'One of the keys in WERK_API_KEYS; sent as "Authorization: Bearer <key>". Leave empty for a server without keys.',
		},
	];

	authenticate: IAuthenticateGeneric = {
		type: 'generic',
		properties: {
			headers: {
				Authorization: '={{$credentials.apiKey ? "Bearer " + $credentials.apiKey : ""}}',
			},
		},
	};

	test: ICredentialTestRequest = {
		request: {
			baseURL: '={{$credentials.baseUrl.replace(/\\/+$/, "")}}',
			url: '/werk/v1/info',
			method: 'GET',
		},
	};
}
